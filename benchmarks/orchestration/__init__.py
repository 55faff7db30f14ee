"""Dagster's side: code-location import, sensor ticks, backfill launch and policy, orchestration at scale
(``orchestration_costs`` and ``step_start_probe`` are the pieces ``capacity.bench_duty_cycle`` reuses)."""
