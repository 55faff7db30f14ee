"""Importing the code location: today's, against one that loads its model libraries at import.

Why: every run worker, multiprocess step and code server imports ``dagster_project.definitions``
before anything else, so its wall time and memory are a fixed cost of each. The model libraries
(torch, and scipy under datasketch, pandas, jiwer) load in the steps that use them, not at import.
The baseline is the same import with those libraries imported first, inside the timed span: what
the code location cost when its modules imported them at module level. Both run in fresh
interpreters (``benchmarks.orchestration.orchestration_costs.code_location_import_once``), alternating, so the
machine's load is shared; median of ``--repeats`` each: the interpreter's wall time, the import's
own, and the process's peak RSS.

    python -m benchmarks.orchestration.bench_code_location_import [--quick] [--repeats N]
"""

from __future__ import annotations

import argparse

from benchmarks.orchestration.orchestration_costs import code_location_import_once, median_import
from benchmarks.report import emit, progress, ratio, stdout_to_stderr

BASELINE_PRELOAD = "import datasketch, jiwer, pandas, speechdata.features.speech, speechdata.features.text"
"""What the code location's modules imported at module level before they deferred it: the feature
stage its model calls (and torch with them), the transcript fingerprint datasketch (and scipy), the
dataset build jiwer, and a table built at import pandas."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one import of each")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats = 1
    lazy, baseline = [], []
    with stdout_to_stderr():
        for repeat in range(args.repeats):
            lazy.append(code_location_import_once())
            baseline.append(code_location_import_once(BASELINE_PRELOAD))
            progress(
                f"repeat {repeat + 1}/{args.repeats}: import {lazy[-1]['import_s']:.2f} s, "
                f"baseline {baseline[-1]['import_s']:.2f} s"
            )
    now, then = median_import(lazy), median_import(baseline)
    figures = {
        "code_location_import": now,
        "baseline_eager_model_libraries": then,
        "ratio_import_s_over_baseline": ratio(now["import_s"], then["import_s"]),
        "ratio_interpreter_wall_s_over_baseline": ratio(now["interpreter_wall_s"], then["interpreter_wall_s"]),
        "ratio_peak_rss_over_baseline": ratio(now["peak_rss_gb"], then["peak_rss_gb"]),
    }
    emit(
        "code_location_import",
        {"quick": args.quick, "repeats": args.repeats, "baseline_preload": BASELINE_PRELOAD},
        figures,
    )


if __name__ == "__main__":
    main()
