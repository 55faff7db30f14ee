"""Near duplicates per new shard: the decide CPU per earlier posting read, this checkout's code beside a
baseline's, on the same speech-like pooled index, with where the CPU goes.

Why: on speech a new shard reads tens of millions of earlier postings at 10^4-10^5 hours (audio keys
under the cap vote with every posting; envelope band pairs' chance postings), so the NumPy work per
posting read (its blocks decoded and filtered, sorted and merged with the shard's own, looked up per
utterance, its context compared, its (owner, offset) vote counted) is minutes per shard.

The index is ``bench_near_dup_capped_keys``'s (synthetic entries, every sub-fingerprint drawn from a
pool of ``2^--pool-bits`` values; capped segments written by ``write_index``, merged 8 at a time),
built once per ``--shards`` size by this checkout. A new shard (a tenth of it copies) is then decided
(not committed) through ``bench_near_dup_skip_capped``'s path (reserve, prefetch, settle, decide; the
reader's skipping on), alternately by this checkout's ``speechdata`` and by the baseline's
(``--baseline DIR``: a folder holding another version's ``speechdata`` package, e.g.
``git archive main speechdata | tar -x -C DIR``; none: this checkout against itself), each run in a
fresh interpreter. Figures per arm: the decide CPU (each run), the postings read, the CPU per posting
read (the least run's), and the CPU of each phase (``process_time`` around the functions on the
path, those the arm has). The decisions must be the same. ``--quick``: 11 shards of 20 utterances,
the cap lowered to 3, one run each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.report import emit, leave_measured, progress, ratio, stdout_to_stderr

ROOT = Path(__file__).resolve().parents[2]

PHASES = (
    # (module under speechdata.quality, attribute, phase): each wrapped where the arm has it.
    ("near_dup_index_reader", "lookup_segment", "blocks read, checked and searched"),
    ("near_dup_index_reader", "IndexReader._counted", "reader: segments looked up, postings counted"),
    ("near_dup_postings", "merge_earlier_postings", "earlier postings sorted and merged with the shard's"),
    ("near_dup_postings", "merged_fields", "earlier postings sorted and merged with the shard's"),
    # Gathering and verification left near_dup_matching for modules of their own: an arm from before
    # that has them there, one after in near_dup_candidates and near_dup_verification.
    ("near_dup_matching", "_candidates", "candidates, every utterance"),
    ("near_dup_candidates", "_candidates", "candidates, every utterance"),
    ("near_dup_matching", "_key_postings", "  of which: an utterance's keys' postings found"),
    ("near_dup_candidates", "_key_postings", "  of which: an utterance's keys' postings found"),
    ("near_dup_postings", "context_bit_errors", "  of which: contexts compared"),
    ("near_dup_matching", "_best_offset_per_owner", "  of which: best offset per owner"),
    ("near_dup_candidates", "_best_offset_per_owner", "  of which: best offset per owner"),
    ("near_dup_index_reader", "IndexReader.entries", "entries of candidates read"),
    ("near_dup_matching", "_decide_one", "candidates verified"),
    ("near_dup_verification", "_decide_one", "candidates verified"),
)


def _timed_phases() -> dict[str, float]:
    """Wrap each phase's function (where this arm has it) to add its CPU seconds to the dict returned."""
    import importlib

    spent: dict[str, float] = {}

    def timed(function, phase: str):
        def wrapper(*args, **kwargs):
            started = time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                spent[phase] = spent.get(phase, 0.0) + time.process_time() - started

        return wrapper

    for module_name, attribute, phase in PHASES:
        try:
            module = importlib.import_module(f"speechdata.quality.{module_name}")
        except ModuleNotFoundError:
            continue  # not in this arm
        owner, _, name = attribute.rpartition(".")
        holder = getattr(module, owner) if owner else module
        if hasattr(holder, name):
            setattr(holder, name, timed(getattr(holder, name), phase))
    return spent


def _child(code: str, url: str, utterances: int, bits: int, max_occurrences: int | None) -> None:
    """One measurement with ``code``'s ``speechdata`` first on the path; its figures as one JSON line."""
    sys.path.insert(0, code)
    import speechdata
    from benchmarks.corpus.bench_near_dup_skip_capped import _measure

    spent = _timed_phases()
    results: dict = {}
    with stdout_to_stderr():
        _measure(url, utterances, bits, max_occurrences, True, results)
    results["speechdata"] = str(Path(speechdata.__file__).parent)
    results["phases_cpu_s"] = {phase: round(seconds, 3) for phase, seconds in spent.items()}
    print(json.dumps(results), flush=True)
    leave_measured()


def _built(url: str, shards: int, utterances: int, bits: int, max_occurrences: int | None, results) -> None:
    from benchmarks.corpus.bench_near_dup_skip_capped import _built as built

    built(url, shards, utterances, bits, max_occurrences, results)


def _run_child(code: str, url: str, utterances: int, bits: int, max_occurrences: int | None) -> dict:
    command = [sys.executable, "-m", "benchmarks.corpus.bench_near_dup_vote_cpu", "--child", code, url]
    command += [str(utterances), str(bits), str(max_occurrences or 0)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"measurement with {code} exited {done.returncode}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _arm_figures(runs: list[dict]) -> dict:
    least = min(runs, key=lambda run: run["decide_cpu_s"])
    return {
        "speechdata": least["speechdata"],
        "decide_cpu_s_each": [run["decide_cpu_s"] for run in runs],
        "decide_cpu_s": least["decide_cpu_s"],
        "decide_wall_s": min(run["decide_wall_s"] for run in runs),
        "postings_read": least["postings_read"],
        "blocks_read": least["blocks_read"],
        "cpu_us_per_posting_read": round(least["decide_cpu_s"] / max(least["postings_read"], 1) * 1e6, 3),
        "phases_cpu_s": least["phases_cpu_s"],
        "copies_found": least["copies_found"],
    }


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        code, url, utterances, bits, max_occurrences = argv[1:6]
        _child(code, url, int(utterances), int(bits), int(max_occurrences) or None)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="11 shards of 20 utterances, the cap lowered to 3")
    parser.add_argument("--baseline", default=None, help="a folder holding the baseline's speechdata package")
    parser.add_argument("--shards", type=int, nargs="+", default=[83, 166], help="index sizes, in shards")
    parser.add_argument("--utterances", type=int, default=200, help="per shard, and in the new shard")
    parser.add_argument("--pool-bits", type=int, default=12, help="2^bits sub-fingerprint values")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each arm, alternating")
    parser.add_argument("--max-occurrences", type=int, default=None, help="the vote's limit; default the stage's")
    args = parser.parse_args(argv)
    if args.quick:
        args.shards, args.utterances, args.max_occurrences, args.repeats = [11], 20, 3, 1
    arms = {"baseline": str(Path(args.baseline or ROOT).resolve()), "this": str(ROOT)}
    from benchmarks.corpus.bench_near_duplicates_index import in_fresh_process

    per_size: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-near-dup-vote-cpu-") as folder:
        for shards in args.shards:
            url = os.path.join(folder, f"s{shards}")
            built = in_fresh_process(_built, url, shards, args.utterances, args.pool_bits, args.max_occurrences)
            runs: dict[str, list[dict]] = {arm: [] for arm in arms}
            for _ in range(args.repeats):
                for arm, code in arms.items():
                    runs[arm].append(_run_child(code, url, args.utterances, args.pool_bits, args.max_occurrences))
                    progress(f"{shards} shards, {arm}: {runs[arm][-1]['decide_cpu_s']} s CPU")
            decisions = [run.pop("decisions") for arm_runs in runs.values() for run in arm_runs]
            figures = {"build_s": built["build_s"], "same_decisions": all(d == decisions[0] for d in decisions)}
            figures.update({arm: _arm_figures(arm_runs) for arm, arm_runs in runs.items()})
            figures["this_over_baseline"] = {
                name: ratio(figures["this"][name], figures["baseline"][name])
                for name in ("decide_cpu_s", "cpu_us_per_posting_read", "postings_read")
            }
            per_size[str(shards)] = figures
    emit(
        "near_dup_vote_cpu",
        {
            "quick": args.quick,
            "shards": args.shards,
            "utterances": args.utterances,
            "pool_bits": args.pool_bits,
            "max_occurrences": args.max_occurrences,
            "repeats": args.repeats,
            "baseline": arms["baseline"],
        },
        {"per_size": per_size},
    )


if __name__ == "__main__":
    main()
