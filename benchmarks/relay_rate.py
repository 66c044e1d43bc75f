"""``python -m benchmarks.relay_rate``: the relay_rate scenario
(benchmarks/scenarios/relay_rate.py), as ``python -m benchmarks --only relay_rate`` runs it,
with its own arguments."""

from benchmarks.scenarios.relay_rate import main

if __name__ == "__main__":
    main()
