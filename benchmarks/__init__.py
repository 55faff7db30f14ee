"""Benchmarks: one script per measured figure, each printing one JSON line (:mod:`benchmarks.report`).

They live in folders by kind (``stages``, ``storage``, ``corpus``, ``orchestration``, ``accuracy``,
``capacity``) and run as ``python -m benchmarks.<kind>.<name>``; ``python -m benchmarks.run_all`` runs
every ``bench_*`` among them. ``benchmarks.gpu_features`` and ``benchmarks.bench_duty_cycle`` stay
runnable by their short names, which docs/deploying.md and docs/performance.md use.
"""
