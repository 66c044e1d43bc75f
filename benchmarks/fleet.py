"""``python -m benchmarks.fleet``: the fleet scenario (benchmarks/scenarios/fleet.py), as
``python -m benchmarks --only fleet`` runs it, with its own arguments (``--quick``)."""

from benchmarks.scenarios.fleet import main

if __name__ == "__main__":
    main()
