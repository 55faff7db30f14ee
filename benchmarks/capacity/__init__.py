"""GPU capacity: the per-shard GPU stages at real model sizes (``gpu_features``, ``gpu_ctc``), model
load costs, stage I/O, the capacity model and the duty-cycle simulation ``bench_duty_cycle`` composes."""
