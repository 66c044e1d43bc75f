"""``python -m benchmarks.ingress``: the ingress scenario (benchmarks/scenarios/ingress.py), as
``python -m benchmarks --only ingress`` runs it, with its own arguments."""

from benchmarks.scenarios.ingress import main

if __name__ == "__main__":
    main()
