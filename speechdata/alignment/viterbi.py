"""Exact CTC forced-alignment Viterbi, path-identical to NeMo's ``viterbi_decoding``.

NeMo's aligner (``nemo.collections.asr.parts.utils.aligner_utils.viterbi_decoding``) loops over
frames in Python with a dozen tensor ops per frame.
This module runs the same recurrence, with the same float32 arithmetic and the same tie-breaking, in
a compiled loop (numba, ``nogil``; the kernels are in :mod:`speechdata.alignment.kernels`), so it
returns NeMo's path bit for bit, two orders of magnitude faster on one core
(``benchmarks/stages/bench_viterbi.py`` measures both; docs/performance.md has the figures). The first call
in a process pays a one-off cost: importing numba and loading the kernel (compiled on first use and
cached by numba under ``speechdata/__pycache__`` when writable, else recompiled per process).

Conventions (NeMo's): for target tokens ``t_1..t_L`` (no blanks) the states are
``y = [blank, t_1, blank, t_2, ..., blank, t_L, blank]`` (``U = 2L + 1``; empty text: ``U = 1``).
A path gives one state index per frame; moves are stay, ``u + 1`` and ``u + 2`` (the latter only
when ``y[u] != y[u - 2]``, i.e. skipping a blank between two different tokens); the path starts in
state 0 or 1 and ends in ``U - 1`` or ``U - 2``. CTC needs a blank between two adjacent identical
tokens, so an alignment exists only when ``T >= L + repeats`` (``repeats`` = number of adjacent
equal token pairs); otherwise :class:`AlignmentImpossible`.

What "exact" means here, step by step as NeMo does it (batch of one, float32):

* ``v[0, u] = log_probs[0, y[u]]`` for ``u < 2``, ``-3.4e38`` (NeMo's ``padding_value``) elsewhere;
* for ``t >= 1``: with ``e = log_probs[t, y[u]]`` the candidates are ``v[u] + e``,
  ``v[u-1] + e`` and ``v[u-2] + e`` (a missing or forbidden predecessor reads ``-3.4e38``), each
  rounded to float32 *before* the max (NeMo adds first, then ``torch.max``); the max's first index
  wins ties (stay, then ``u - 1``, then ``u - 2``), as ``torch.max`` does;
* at the last frame ``U - 2`` wins a tie with ``U - 1`` (``torch.argmax``), then backpointers.

Why not ``torchaudio.functional.forced_align``: its C++ kernel is fast (though slower than this
one), but the torchaudio 2.11 CPU build behaves as if it kept "stay" when
the ``u - 1`` and ``u - 2`` candidates tie exactly and both beat "stay" (the upstream
``else if (x1 > x0 && x1 > x2)``), so it can return a clearly worse path: on a 4-frame hand-made
case log-prob -23 against NeMo's (optimal) -4; with log-probs rounded to quarters, a worse path in
34 of 50 benchmark utterances (up to 3.75 nats); on random float32 log-probs a path 0.37 worse in
1 of 5,000 utterances (a tie made by float32 rounding). It also takes the max before adding the
frame's log-prob, which breaks near-ties differently from NeMo. ``tests/unit/test_ctc_viterbi.py``
keeps the hand-made case; ``benchmarks/stages/bench_viterbi.py`` reports torchaudio next to ours.

Without numba (a core dependency, but the kernel still runs where it cannot be imported) the
same recurrence runs vectorised over states in numpy: same arithmetic, same paths, an order of
magnitude slower than numba and still faster than NeMo.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

import numpy as np

from speechdata.alignment.kernels import BAD_TOKEN, NAN, NO_FINITE_PATH, OK, TOO_FEW_FRAMES, kernel_for

if TYPE_CHECKING:
    import torch

__all__ = [
    "AlignmentImpossible",
    "ViterbiPath",
    "count_repeats",
    "ctc_viterbi",
    "ctc_viterbi_many",
    "state_tokens",
]

ArrayLike = Union["torch.Tensor", np.ndarray, Sequence[int]]


class AlignmentImpossible(ValueError):
    """The text cannot be CTC-aligned to these frames (``T < L + repeats``, or no finite path)."""

    def __init__(self, num_frames: int, num_tokens: int, repeats: int, reason: str | None = None):
        self.num_frames = int(num_frames)
        self.num_tokens = int(num_tokens)
        self.repeats = int(repeats)
        self.reason = reason
        what = reason or (
            f"T={self.num_frames} frames < L + repeats = {self.num_tokens} + {self.repeats} = "
            f"{self.num_tokens + self.repeats}"
        )
        super().__init__(
            f"CTC alignment impossible: {what} (T={self.num_frames} frames, L={self.num_tokens} target "
            f"tokens, repeats={self.repeats} adjacent repeated tokens, each needing a blank frame between)"
        )

    def __reduce__(self):  # keep it picklable (process pools, Dagster events)
        return (type(self), (self.num_frames, self.num_tokens, self.repeats, self.reason))


@dataclass(frozen=True)
class ViterbiPath:
    """The best CTC path of one utterance.

    ``states``: np.int32 [T], NeMo's state index per frame (even = blank, ``2k + 1`` = token ``k``).
    ``frame_log_probs``: np.float32 [T], the log-prob of the label emitted at each frame on the path.
    ``num_tokens``: L, the number of target tokens (``U = 2L + 1``).
    """

    states: np.ndarray
    frame_log_probs: np.ndarray
    num_tokens: int

    @property
    def num_frames(self) -> int:
        return int(self.states.shape[0])

    @property
    def total_log_prob(self) -> float:
        """Sum of the frame log-probs along the path (the path's log-probability)."""
        return float(np.sum(self.frame_log_probs, dtype=np.float64))

    @property
    def score(self) -> float:
        """Mean frame log-prob along the path."""
        return self.total_log_prob / self.num_frames

    def token_frame_spans(self) -> list[tuple[int, int]]:
        """``(first_frame, last_frame_exclusive)`` of each target token (state ``2k + 1``), in order.

        On a valid path every token holds at least one frame and its frames are contiguous (the
        path never moves backwards), so the spans are non-empty, ordered and disjoint.
        """
        if self.num_tokens == 0:
            return []
        token_states = 2 * np.arange(self.num_tokens, dtype=np.int64) + 1
        starts = np.searchsorted(self.states, token_states, side="left")
        ends = np.searchsorted(self.states, token_states, side="right")
        return [(int(s), int(e)) for s, e in zip(starts, ends, strict=True)]


def state_tokens(targets: ArrayLike, blank: int) -> list[int]:
    """NeMo's interleaved state labels ``[blank, t_1, blank, ..., t_L, blank]`` (its ``y_batch[0]``)."""
    y = [int(blank)]
    for token in _targets_array(targets).tolist():
        y += [token, int(blank)]
    return y


def count_repeats(targets: ArrayLike) -> int:
    """Number of adjacent equal token pairs (each needs an extra blank frame)."""
    t = _targets_array(targets)
    return int(np.count_nonzero(t[1:] == t[:-1])) if t.size > 1 else 0


def ctc_viterbi(log_probs: ArrayLike, targets: ArrayLike, blank: int, *, backend: str = "auto") -> ViterbiPath:
    """Best CTC path of ``targets`` through ``log_probs`` [T, V], as NeMo's ``viterbi_decoding``.

    ``log_probs`` (torch tensor on any device, or numpy) is cast to float32, the precision NeMo
    aligns in. ``blank`` is the blank's column (NeMo's CTC models: ``V - 1``; a negative index counts
    from the end). ``backend``: ``"auto"`` (numba when importable, else numpy), ``"numba"`` or
    ``"numpy"``; all give the same path.

    Raises :class:`AlignmentImpossible` (a ``ValueError``) when ``T < L + repeats`` (``T == 0``
    included) or when every path has a ``-inf`` log-prob (where NeMo returns a path that does not
    start in state 0 or 1), and plain ``ValueError`` for malformed input: wrong shapes, a blank or
    out-of-range id in ``targets``, NaN log-probs on the target's columns.
    """
    lp = _log_probs_array(log_probs)
    num_frames, vocab = lp.shape
    blank = _blank_index(blank, vocab)
    tokens = _targets_array(targets)
    num_tokens = int(tokens.size)
    y = np.full(2 * num_tokens + 1, blank, dtype=np.int64)
    y[1::2] = tokens
    # the checks run inside the kernel (one pass, without the GIL); errors are explained here
    states, frame_log_probs, status = kernel_for(backend)(lp, y)
    if status != OK:
        _raise_for(status, num_frames, vocab, tokens, blank)
    return ViterbiPath(states=states, frame_log_probs=frame_log_probs, num_tokens=num_tokens)


def _raise_for(status: int, num_frames: int, vocab: int, tokens: np.ndarray, blank: int) -> None:
    if status == BAD_TOKEN:
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= vocab:
            raise ValueError(f"target ids must lie in [0, {vocab}); got min {low}, max {high}")
        raise ValueError(f"targets must not contain the blank id {blank}")
    repeats = count_repeats(tokens)
    if status == TOO_FEW_FRAMES:
        raise AlignmentImpossible(num_frames, tokens.size, repeats)
    if status == NAN:
        raise ValueError("log_probs hold NaN in the blank's or a target token's column")
    if status == NO_FINITE_PATH:  # NeMo would return a path through its padding value here
        raise AlignmentImpossible(num_frames, tokens.size, repeats, reason="every path has a -inf log-prob")
    raise RuntimeError(f"unexpected kernel status {status}")


def ctc_viterbi_many(
    items: Iterable[tuple[ArrayLike, ArrayLike, int]],
    workers: int = 1,
    *,
    return_errors: bool = False,
    backend: str = "auto",
) -> list[ViterbiPath | AlignmentImpossible]:
    """:func:`ctc_viterbi` over ``(log_probs, targets, blank)`` items, results in input order.

    ``workers > 1`` runs a thread pool (capped at the CPU count) over contiguous chunks of items
    (about four per worker): the numba kernel releases the GIL. Not a process pool: pickling each
    [T, V] log-prob matrix to a worker costs far more than aligning it (slower than one thread). How
    much a second thread buys depends on the machine: the kernel reads most of the [T, V] matrix (~1
    MB per 15 s utterance at V = 1025), so it is memory-bound; on the 2-vCPU VM this was built on,
    which gets no more memory throughput from two threads than from one, two workers were no faster
    than one (``benchmarks/stages/bench_viterbi.py`` measures it; hosts with more memory bandwidth per core
    were not measured).

    With ``return_errors`` an :class:`AlignmentImpossible` takes that item's place in the result
    list; otherwise the first one (in input order) is raised.
    """
    items = list(items)
    workers = max(1, min(int(workers), len(items) or 1, os.cpu_count() or 1))
    kernel_for(backend)  # load / compile once, before the threads start

    def one(item: tuple[ArrayLike, ArrayLike, int]) -> ViterbiPath | AlignmentImpossible:
        log_probs, targets, blank = item
        try:
            return ctc_viterbi(log_probs, targets, blank, backend=backend)
        except AlignmentImpossible as error:
            if return_errors:
                return error
            raise

    if workers == 1:
        return [one(item) for item in items]
    size = -(-len(items) // (4 * workers))
    chunks = [items[i : i + size] for i in range(0, len(items), size)]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ctc_viterbi") as pool:
        return [result for chunk in pool.map(lambda c: [one(item) for item in c], chunks) for result in chunk]


# --- input handling -------------------------------------------------------------------------------


def _log_probs_array(log_probs: ArrayLike) -> np.ndarray:
    if hasattr(log_probs, "detach"):  # a torch tensor; torch itself is not imported for numpy callers
        array = log_probs.detach().float().cpu().numpy()
    else:
        array = np.asarray(log_probs, dtype=np.float32)
    if array.ndim != 2:
        raise ValueError(f"log_probs must be 2-D [T, V]; got shape {tuple(array.shape)}")
    if array.shape[1] == 0:
        raise ValueError("log_probs has no columns (V == 0)")
    return np.ascontiguousarray(array)


def _targets_array(targets: ArrayLike) -> np.ndarray:
    if hasattr(targets, "detach"):  # a torch tensor
        targets = targets.detach().cpu().numpy()
    array = np.asarray(targets)
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"targets must be a 1-D sequence of integer token ids; got {array.dtype} {array.shape}")
    return array.astype(np.int64, copy=False)


def _blank_index(blank: int, vocab: int) -> int:
    blank = int(blank)
    if not -vocab <= blank < vocab:
        raise ValueError(f"blank id {blank} outside [0, {vocab})")
    return blank % vocab
