"""What the scenarios share, by role: the stack they run on (``stack``, ``processes``), the
load they offer (``trace``, ``offer``, ``callers``), the engine alone (``engine``), what they
sample and read back (``sampling``, ``receivers``, ``topics``), the measurements two
scenarios make alike (``ingress``, ``relay``, ``costs``), one scenario's larger pieces
(``goodput``, ``watch``, ``fleet``, ``retention``), the plots and the reports. Nothing here
imports a scenario (tests/unit/test_benchmarks.py)."""
