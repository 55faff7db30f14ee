"""Hand the longest test modules to the xdist workers first (``make test``: ``-n 2 --dist loadfile``).

Under ``--dist loadfile`` a module runs whole on one worker, and xdist queues the modules by their
number of tests, most first. The slowest modules hold one to five tests each, so they came last: a
worker took a two-minute module near the end while the other ran out of work and waited. Started
first (longest processing time first), the long modules overlap with everything else and the end of
the run is the many short unit modules, which even the two workers out.

``LONGEST_MODULES`` is kept from the ``--durations`` output of the last full run (docs/testing.md,
"The slowest 25 tests"), longest first: a module missing from it keeps xdist's order, after these.
The order changes only when a module runs, never what it runs.
"""

from __future__ import annotations

LONGEST_MODULES = (
    "tests/e2e/test_backfills_from_the_ui.py",
    "tests/e2e/test_landing_to_materialization.py",
    "tests/integration/test_crash_safety.py",
    "tests/integration/test_benchmarks_smoke.py",
    "tests/integration/test_demo.py",
    "tests/integration/test_exports.py",
    "tests/integration/test_model_load_costs.py",
    "tests/integration/test_bench_duty_cycle.py",
    "tests/integration/test_benchmarks_smoke_backfill.py",
    "tests/integration/test_packaging_assets.py",
    "tests/integration/test_attacks_confinement_everywhere.py",
    "tests/integration/test_gpu_workers_ray.py",
    "tests/integration/test_every_shard_asset_bounds.py",
    "tests/integration/test_storage_codec_outputs.py",
    "tests/unit/test_cli_conventions.py",
    "tests/unit/test_ctc_viterbi.py",
    "tests/integration/test_catalog_quality_metadata.py",
)


def longest_first(modules: list[str]) -> list[str]:
    """``modules`` (xdist's queue) with the known long ones first, in ``LONGEST_MODULES`` order;
    the others keep their order after them."""
    rank = {module: i for i, module in enumerate(LONGEST_MODULES)}
    return sorted(modules, key=lambda module: rank.get(module, len(rank)))


def make_scheduler(config, log):
    """xdist's file scheduler, its queue reordered by :func:`longest_first` before the first module
    is handed out; None for any other ``--dist`` mode (xdist then picks its own)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LongestFirstLoadFileScheduling(LoadFileScheduling):
        ordered = False

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:
                self.ordered = True
                queue = dict(self.workqueue)
                self.workqueue.clear()
                for module in longest_first(list(queue)):
                    self.workqueue[module] = queue[module]
            super()._assign_work_unit(node)

    return LongestFirstLoadFileScheduling(config, log)
