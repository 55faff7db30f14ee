"""CTC forced-alignment Viterbi: speechdata.alignment.viterbi against NeMo's viterbi_decoding, same paths.

Why: every aligned utterance goes through a CTC Viterbi; NeMo's ``viterbi_decoding`` (the
reference the rest of the pipeline was validated with) loops over frames in Python. The issue's
target is at least 16x NeMo's throughput with identical paths.

Input: ``--utterances`` (200) synthetic utterances of 10-20 s at 80 ms frames (T = 125..250),
V = 1025 (blank = 1024, NeMo's CTC convention), L = T/3 +- 5 random token ids (adjacent repeats
occur by chance), log-probs = log_softmax of standard normals; all seeded (``--seed``). Measured,
wall clock (``time.perf_counter``), ``torch.set_num_threads(1)``:

* ``nemo``: ``viterbi_decoding`` one utterance per call, batch of one, on CPU, one pass. NeMo lives
  in its own environment (``.venv-nemo``, ``make nemo-env``: its antlr4 pin cannot share ``.venv``
  with Dagster), so this module runs itself there with ``--nemo-reference`` on the saved utterances
  and reads back NeMo's paths and seconds (import not timed);
* ``ours``: ``ctc_viterbi_many(workers=1)`` (numba kernel), and ``workers=2`` (thread pool), each
  the median of ``--repeats`` passes after one untimed pass (which also loads / compiles the
  kernel; that one-off cost is reported as ``kernel_load_s``);
* ``ours_numpy``: the numpy fallback backend (used when numba cannot be imported), one pass;
* ``torchaudio``: ``torchaudio.functional.forced_align`` (median of ``--repeats``), for reference
  only: its 2.11 CPU kernel mishandles exact ties (see ``speechdata/alignment/viterbi.py``).

Every path of ours (each backend, each worker count) is compared with NeMo's state for state;
``path_mismatches`` counts the utterances whose paths differ anywhere (``identical_paths`` is true
when every count, tied set included, is 0). For torchaudio, the per-frame labels are compared with
NeMo's (``label_mismatches``) and ``worse_paths`` counts those whose path log-prob is more than
1e-3 below NeMo's. Random float32 log-probs almost never tie exactly, so ``tied_log_probs`` re-runs
the first ``--tied-utterances`` (50) with log-probs rounded to multiples of 1/4, where exact ties
are everywhere: NeMo, ours and torchaudio on those (paths only, not timed).
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

import numpy as np

from benchmarks.report import emit, progress, ratio, stdout_to_stderr, timed, timed_call

FRAME_S = 0.08
VOCAB = 1025
TARGET_RATIO = 16.0
REPO_ROOT = Path(__file__).resolve().parents[2]
NEMO_PYTHON = REPO_ROOT / ".venv-nemo" / "bin" / "python"


def make_utterances(count: int, seed: int) -> list[tuple]:
    import torch

    rng = np.random.default_rng(seed)
    blank = VOCAB - 1
    items = []
    for _ in range(count):
        seconds = rng.uniform(10.0, 20.0)
        T = int(round(seconds / FRAME_S))
        L = max(1, T // 3 + int(rng.integers(-5, 6)))
        targets = rng.integers(0, blank, size=L)  # ids 0..1023, never the blank
        logits = torch.from_numpy(rng.standard_normal((T, VOCAB)).astype(np.float32))
        items.append((torch.log_softmax(logits, dim=-1), targets, blank))
    return items


def nemo_paths(items: list[tuple]) -> tuple[list[np.ndarray], float]:
    """NeMo's paths for ``items`` and the seconds they took (in ``.venv-nemo``, NeMo imported)."""
    import torch
    from nemo.collections.asr.parts.utils.aligner_utils import viterbi_decoding

    from speechdata.alignment.viterbi import state_tokens

    paths = []
    started = time.perf_counter()
    for log_probs, targets, blank in items:
        y = state_tokens(targets, blank)
        T = log_probs.shape[0]
        out = viterbi_decoding(
            log_probs[None], torch.tensor([y]), torch.tensor([T]), torch.tensor([len(y)]), viterbi_device="cpu"
        )
        paths.append(np.asarray(out[0], dtype=np.int64))
    return paths, time.perf_counter() - started


def write_nemo_reference(cases_path: str, result_path: str) -> None:
    """The ``--nemo-reference`` side, in ``.venv-nemo``: NeMo's paths and seconds for each saved set."""
    import nemo.collections.asr.parts.utils.aligner_utils  # noqa: F401  (~30 s, not timed)
    import torch

    result = {}
    for name, items in torch.load(cases_path, weights_only=True).items():
        paths, seconds = nemo_paths(items)
        result[name] = {"paths": [path.tolist() for path in paths], "seconds": seconds}
    Path(result_path).write_text(json.dumps(result))


def nemo_paths_in_nemo_env(item_sets: dict[str, list[tuple]]) -> dict[str, tuple[list[np.ndarray], float]]:
    """For each named set of utterances, NeMo's paths and seconds, from one process in ``.venv-nemo``."""
    import torch

    if not NEMO_PYTHON.exists():
        raise SystemExit(f"bench_viterbi: NeMo's environment {NEMO_PYTHON.parent.parent} is missing: `make nemo-env`")
    with tempfile.TemporaryDirectory(prefix="bench-viterbi-") as work:
        cases, result = Path(work) / "cases.pt", Path(work) / "nemo.json"
        saved = {
            name: [(lp, [int(t) for t in targets], blank) for lp, targets, blank in items]
            for name, items in item_sets.items()
        }
        torch.save(saved, cases)
        subprocess.run(
            [str(NEMO_PYTHON), "-m", "benchmarks.stages.bench_viterbi", "--nemo-reference", str(cases), str(result)],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            stdout=sys.stderr,  # NeMo logs on stdout; this benchmark's stdout is its record
            check=True,
        )
        found = json.loads(result.read_text())
    return {
        name: ([np.asarray(path, dtype=np.int64) for path in found[name]["paths"]], found[name]["seconds"])
        for name in item_sets
    }


def mismatches(paths: list, reference: list[np.ndarray]) -> int:
    return sum(not np.array_equal(path.states, ref) for path, ref in zip(paths, reference, strict=True))


def torchaudio_aligner(items: list[tuple]):
    """A zero-argument callable returning torchaudio's per-frame labels for every item."""
    import torch
    import torchaudio.functional as F

    prepared = [(lp[None].contiguous(), torch.from_numpy(t.astype(np.int32))[None], blank) for lp, t, blank in items]
    return lambda: [F.forced_align(lp, t, blank=blank)[0][0].numpy() for lp, t, blank in prepared]


def compare_labels(items: list[tuple], labels: list[np.ndarray], reference: list[np.ndarray]) -> dict:
    """torchaudio's labels against NeMo's paths: how many differ, how many score lower (> 1e-3)."""
    from speechdata.alignment.viterbi import state_tokens

    label_mismatches = worse = 0
    worst_loss = 0.0
    for (lp, targets, blank), got, ref in zip(items, labels, reference, strict=True):
        want = np.asarray(state_tokens(targets, blank))[ref]
        if not np.array_equal(got, want):
            label_mismatches += 1
            frames = np.arange(len(got))
            lp64 = lp.numpy().astype(np.float64)
            loss = float(lp64[frames, want].sum() - lp64[frames, got].sum())
            worse += loss > 1e-3
            worst_loss = max(worst_loss, loss)
    return {"label_mismatches": label_mismatches, "worse_paths": worse, "worst_log_prob_loss": round(worst_loss, 4)}


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="~20 utterances, for smoke runs")
    parser.add_argument("--utterances", type=int, default=None, help="number of utterances (default 200)")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes of the fast aligners")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tied-utterances", type=int, default=None, help="utterances re-run with log-probs rounded to 1/4 (default 50)"
    )
    parser.add_argument("--nemo-reference", nargs=2, metavar=("CASES", "RESULT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.utterances = args.utterances or (20 if args.quick else 200)
    args.repeats = 2 if args.quick else args.repeats
    if args.tied_utterances is None:
        args.tied_utterances = 10 if args.quick else 50
    return args


def measure_ours(cv, items: list[tuple], reference: list[np.ndarray], repeats: int) -> dict:
    """Our aligner with one and two workers (numba), and the numpy backend once: utterances per second
    and paths that differ from NeMo's."""
    count, ours = len(items), {}
    for workers in (1, 2):
        seconds, _, paths = timed(
            lambda workers=workers: cv.ctc_viterbi_many(items, workers=workers), repeats, warm_up=True
        )
        ours[workers] = {"ups": count / seconds, "mismatches": mismatches(paths, reference)}
        progress(
            f"viterbi: ours workers={workers} {ours[workers]['ups']:.1f} utt/s, {ours[workers]['mismatches']} mismatches"
        )
    seconds, numpy_paths = timed_call(lambda: cv.ctc_viterbi_many(items, workers=1, backend="numpy"))
    ours["numpy"] = {"ups": count / seconds, "mismatches": mismatches(numpy_paths, reference)}
    progress(f"viterbi: ours numpy backend {ours['numpy']['ups']:.1f} utt/s, {ours['numpy']['mismatches']} mismatches")
    return ours


def measure_torchaudio(items: list[tuple], reference: list[np.ndarray], repeats: int, nemo_ups: float) -> dict:
    ta_s, _, labels = timed(torchaudio_aligner(items), repeats, warm_up=True)
    ta_ups = len(items) / ta_s
    ta = {"utt_per_s": round(ta_ups, 1), "ratio_over_nemo": ratio(ta_ups, nemo_ups)}
    ta.update(compare_labels(items, labels, reference))
    progress(f"viterbi: torchaudio {ta}")
    return ta


def figures(ours: dict, nemo_ups: float, kernel_load_s: float, ta: dict, tied: dict) -> dict:
    identical = all(ours[key]["mismatches"] == 0 for key in (1, 2, "numpy")) and tied["path_mismatches"] == 0
    return {
        "nemo_utt_per_s": round(nemo_ups, 2),
        "ours_utt_per_s": round(ours[1]["ups"], 1),
        "ours_workers2_utt_per_s": round(ours[2]["ups"], 1),
        "ratio_ours_over_nemo": ratio(ours[1]["ups"], nemo_ups),
        "ratio_ours_workers2_over_nemo": ratio(ours[2]["ups"], nemo_ups),
        "ratio_workers2_over_workers1": ratio(ours[2]["ups"], ours[1]["ups"]),
        "path_mismatches": ours[1]["mismatches"],
        "path_mismatches_workers2": ours[2]["mismatches"],
        "identical_paths": identical,
        "target_ratio": TARGET_RATIO,
        "meets_target": identical and ratio(ours[1]["ups"], nemo_ups) >= TARGET_RATIO,
        "kernel_load_s": round(kernel_load_s, 3),
        "ours_numpy_backend": {
            "utt_per_s": round(ours["numpy"]["ups"], 1),
            "ratio_over_nemo": ratio(ours["numpy"]["ups"], nemo_ups),
            "path_mismatches": ours["numpy"]["mismatches"],
        },
        "torchaudio_forced_align": ta,
        "tied_log_probs": tied,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_arguments(argv)
    if args.nemo_reference:
        write_nemo_reference(*args.nemo_reference)
        return
    import torch

    torch.set_num_threads(1)
    with stdout_to_stderr():
        from speechdata.alignment import viterbi as cv

        items = make_utterances(args.utterances, args.seed)
        frames = sum(lp.shape[0] for lp, _, _ in items)
        progress(f"viterbi: {args.utterances} utterances, {frames} frames, V={VOCAB}")
        kernel_load_s, _ = timed_call(lambda: cv.ctc_viterbi(*items[0], backend="numba"))
        # exact ties: the same utterances with log-probs rounded to quarters
        tied = [(torch.round(lp * 4) / 4, t, blank) for lp, t, blank in items[: args.tied_utterances]]
        references = nemo_paths_in_nemo_env({"random": items, "tied": tied})
        reference, nemo_s = references["random"]
        nemo_ups = args.utterances / nemo_s
        progress(f"viterbi: nemo {nemo_ups:.1f} utt/s")
        ours = measure_ours(cv, items, reference, args.repeats)
        ta = measure_torchaudio(items, reference, args.repeats, nemo_ups)
        tied_reference, _ = references["tied"]
        tied_figures = {
            "utterances": len(tied),
            "path_mismatches": mismatches(cv.ctc_viterbi_many(tied), tied_reference),
            "torchaudio_forced_align": compare_labels(tied, torchaudio_aligner(tied)(), tied_reference),
        }
        progress(f"viterbi: tied log-probs: {tied_figures}")
    emit(
        "bench_viterbi",
        {
            "utterances": args.utterances,
            "frames": frames,
            "frame_s": FRAME_S,
            "vocab": VOCAB,
            "tokens_per_frame": round(sum(len(t) for _, t, _ in items) / frames, 3),
            "repeats": args.repeats,
            "seed": args.seed,
            "tied_utterances": args.tied_utterances,
            "torch_threads": 1,
        },
        figures(ours, nemo_ups, kernel_load_s, ta, tied_figures),
    )


if __name__ == "__main__":
    main()
