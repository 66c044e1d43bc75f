"""``python -m benchmarks.costs``: the costs scenario (benchmarks/scenarios/costs.py), as
``python -m benchmarks --only costs`` runs it, with its own arguments (``--load-s``,
``--idle-s``, ``--out``, ``--quick``)."""

from benchmarks.scenarios.costs import main

if __name__ == "__main__":
    main()
