"""One epoch of DurationBucketBatchSampler (numpy) against the baseline's algorithm in plain Python.

Why: the original ASR sampler builds each epoch with Python lists, dicts and a keyed sort per bucket,
on every rank, at every ``set_epoch``. This makes ``--utterances`` synthetic utterances (gamma
durations 0.3-25 s, 12 languages with a long-tailed mix) and times, wall-clock, building one epoch
for rank 0 of 8 with grad_accum 4, T = 0.3, a 90 s cap: the numpy sampler (median of ``--repeats``
``set_epoch`` calls, plus construction once) and ``tests/unit/asr_sampler_reference.py`` (the test
oracle: the baseline's code with the same random stream), once, on ``--reference-utterances`` of the
same data (all of it by default; a smaller value times a prefix and scales linearly, reported).
Both produce the same batches (checked when the reference runs on everything).
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks.report import emit, progress, ratio, stdout_to_stderr, timed, timed_call
from speechdata.asr.sampler import DurationBucketBatchSampler
from tests.unit.asr_sampler_reference import reference_rank_batches

TARGET_RATIO = 25.0  # the scale target for one sampler epoch
SETTINGS = {"world_size": 8, "rank": 0, "grad_accum": 4, "temperature": 0.3, "max_batch_duration_s": 90.0, "seed": 0}


def synthetic(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    languages = np.array(["hi", "en", "bn", "ta", "te", "mr", "gu", "kn", "ml", "pa", "or", "as"])
    shares = 0.5 ** np.arange(len(languages))
    durations = np.round(np.clip(rng.gamma(2.0, 3.0, n), 0.3, 25.0), 3)
    return durations, languages[rng.choice(len(languages), n, p=shares / shares.sum())]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 000 utterances, for smoke runs")
    parser.add_argument("--utterances", type=int, default=2_000_000)
    parser.add_argument("--reference-utterances", type=int, default=0, help="0: all of them")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.quick:
        args.utterances = 100_000
    reference_n = args.reference_utterances or args.utterances
    with stdout_to_stderr():
        durations, languages = synthetic(args.utterances)
        construct_s, sampler = timed_call(lambda: DurationBucketBatchSampler(durations, languages, **SETTINGS))
        epochs = iter(range(args.repeats))
        numpy_s = timed(lambda: sampler.set_epoch(next(epochs)), args.repeats).median_s
        sampler.set_epoch(0)
        progress(f"numpy: construct {construct_s:.2f} s, epoch {numpy_s:.3f} s, {len(sampler)} batches")
        durations_list, languages_list = durations[:reference_n].tolist(), languages[:reference_n].tolist()
        reference_s, expected = timed_call(
            lambda: reference_rank_batches(durations_list, languages_list, epoch=0, **SETTINGS)
        )
        scaled_reference_s = reference_s * args.utterances / reference_n
        same = list(sampler) == expected if reference_n == args.utterances else None
        progress(f"python reference: {reference_s:.2f} s on {reference_n}, same batches: {same}")
    speedup = ratio(scaled_reference_s, numpy_s)
    emit(
        "asr_sampler",
        {
            "quick": args.quick,
            "utterances": args.utterances,
            "reference_utterances": reference_n,
            "repeats": args.repeats,
            **SETTINGS,
            "target_ratio": TARGET_RATIO,
        },
        {
            "numpy_epoch_seconds": round(numpy_s, 4),
            "numpy_construct_seconds": round(construct_s, 3),
            "reference_seconds": round(reference_s, 3),
            "reference_seconds_scaled_to_all": round(scaled_reference_s, 3),
            "ratio_reference_over_numpy": speedup,
            "ratio_reference_over_numpy_construct": ratio(scaled_reference_s, construct_s),
            "meets_target": bool(speedup and speedup >= TARGET_RATIO),
            "batches_rank0": len(sampler),
            "same_batches_as_reference": same,
        },
    )


if __name__ == "__main__":
    main()
