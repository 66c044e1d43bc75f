"""One module per scenario, each with the shape ``python -m benchmarks`` calls: ``parser()``,
``main(argv)`` and optionally ``headline(report)``; docs/benchmarks.md says what each
measures. No scenario imports another (tests/unit/test_benchmarks.py)."""
