"""Exact CTC forced-alignment Viterbi, path-identical to NeMo's ``viterbi_decoding``.

NeMo's aligner (``nemo.collections.asr.parts.utils.aligner_utils.viterbi_decoding``) loops over
frames in Python with a dozen tensor ops per frame (~30 ms for a 250-frame utterance on one core).
This module runs the same recurrence, with the same float32 arithmetic and the same tie-breaking, in
a compiled loop (numba, ``nogil``), so it returns NeMo's path bit for bit, 170-260x faster on one
core (``benchmarks/bench_viterbi.py``: ~0.2 ms per 10-20 s utterance at V = 1025). The first call
in a process pays ~1-3 s once: importing numba and loading the kernel (compiled on first use and
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

Why not ``torchaudio.functional.forced_align``: its C++ kernel is fast (~0.5 ms per utterance,
a third of this one's speed), but the torchaudio 2.11 CPU build behaves as if it kept "stay" when
the ``u - 1`` and ``u - 2`` candidates tie exactly and both beat "stay" (the upstream
``else if (x1 > x0 && x1 > x2)``), so it can return a clearly worse path: on a 4-frame hand-made
case log-prob -23 against NeMo's (optimal) -4; with log-probs rounded to quarters, a worse path in
34 of 50 benchmark utterances (up to 3.75 nats); on random float32 log-probs a path 0.37 worse in
1 of 5,000 utterances (a tie made by float32 rounding). It also takes the max before adding the
frame's log-prob, which breaks near-ties differently from NeMo. ``tests/unit/test_ctc_viterbi.py``
keeps the hand-made case; ``benchmarks/bench_viterbi.py`` reports torchaudio next to ours.

Without numba (an optional dependency here, installed with nemo_toolkit[asr] through librosa) the
same recurrence runs vectorised over states in numpy: same arithmetic, same paths, ~15-25x slower
than numba and ~9-10x faster than NeMo.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

import numpy as np

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

#: NeMo's ``padding_value`` (a float32 tensor filled with it holds -3.4e38 rounded to float32).
PADDING_VALUE = np.float32(-3.4e38)


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
        return [(int(s), int(e)) for s, e in zip(starts, ends)]


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
    states, frame_log_probs, status = _kernel(backend)(lp, y)
    if status != _OK:
        _raise_for(status, num_frames, vocab, tokens, blank)
    return ViterbiPath(states=states, frame_log_probs=frame_log_probs, num_tokens=num_tokens)


def _raise_for(status: int, num_frames: int, vocab: int, tokens: np.ndarray, blank: int) -> None:
    if status == _BAD_TOKEN:
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= vocab:
            raise ValueError(f"target ids must lie in [0, {vocab}); got min {low}, max {high}")
        raise ValueError(f"targets must not contain the blank id {blank}")
    repeats = count_repeats(tokens)
    if status == _TOO_FEW_FRAMES:
        raise AlignmentImpossible(num_frames, tokens.size, repeats)
    if status == _NAN:
        raise ValueError("log_probs hold NaN in the blank's or a target token's column")
    if status == _NO_FINITE_PATH:  # NeMo would return a path through its padding value here
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
    [T, V] log-prob matrix to a worker costs far more than aligning it (measured ~10x slower than
    one thread). How much a second thread buys depends on the machine: the kernel reads most of the
    [T, V] matrix (~1 MB per 15 s utterance at V = 1025), so it is memory-bound; on the 2-vCPU VM
    this was built on, which gets no more memory throughput from two threads than from one, two
    workers ran at 0.5-0.9x one worker (see ``benchmarks/bench_viterbi.py``; hosts with more
    memory bandwidth per core were not measured).

    With ``return_errors`` an :class:`AlignmentImpossible` takes that item's place in the result
    list; otherwise the first one (in input order) is raised.
    """
    items = list(items)
    workers = max(1, min(int(workers), len(items) or 1, os.cpu_count() or 1))
    _kernel(backend)  # load / compile once, before the threads start

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


# --- kernels --------------------------------------------------------------------------------------
# Both take ``lp`` float32 [T, V] (C-contiguous) and ``y`` int64 [U] (NeMo's state labels: blank at
# even positions, U >= 1) and return ``(states int32 [T], frame_log_probs float32 [T], status)``.
# ``status`` is one of the codes below; the states are meaningful only with ``_OK``.

_OK, _BAD_TOKEN, _TOO_FEW_FRAMES, _NAN, _NO_FINITE_PATH = 0, 1, 2, 3, 4

Kernel = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, int]]


def _viterbi_numpy(lp: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """NeMo's recurrence vectorised over states, one numpy step per frame."""
    num_frames, vocab = lp.shape
    num_states = y.shape[0]
    empty = (np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32))
    tokens = y[1::2]
    if np.any((tokens < 0) | (tokens >= vocab) | (tokens == y[0])):
        return (*empty, _BAD_TOKEN)
    repeats = int(np.count_nonzero(tokens[1:] == tokens[:-1]))
    if num_frames == 0 or num_frames < tokens.size + repeats:
        return (*empty, _TOO_FEW_FRAMES)
    emissions = lp[:, y]
    if np.isnan(emissions).any():
        return (*empty, _NAN)
    pad = PADDING_VALUE
    skip = np.zeros(num_states, dtype=np.bool_)  # u-2 -> u allowed: y[u] != y[u-2], u >= 2
    skip[2:] = y[2:] != y[:-2]
    v = np.full(num_states, pad, dtype=np.float32)
    v[:2] = emissions[0, :2]
    backpointers = np.zeros((num_frames, num_states), dtype=np.int8)
    prev1 = np.full(num_states, pad, dtype=np.float32)
    prev2 = np.full(num_states, pad, dtype=np.float32)
    no_skip = ~skip
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(1, num_frames):
            e = emissions[t]
            prev1[1:] = v[:-1]
            prev2[2:] = v[:-2]
            prev2[no_skip] = pad
            best = v + e
            c1 = prev1 + e
            c2 = prev2 + e
            take1 = c1 > best
            best = np.where(take1, c1, best)
            take2 = c2 > best
            v = np.where(take2, c2, best)
            backpointers[t] = np.where(take2, 2, take1)
    u = 0 if num_states == 1 else num_states - 2 if v[num_states - 2] >= v[num_states - 1] else num_states - 1
    states = np.empty(num_frames, dtype=np.int32)
    states[-1] = u
    for t in range(num_frames - 1, 0, -1):
        u -= int(backpointers[t, u])
        states[t - 1] = u
    frame_log_probs = emissions[np.arange(num_frames), states]
    if states[0] > 1 or np.isneginf(frame_log_probs).any():
        return (*empty, _NO_FINITE_PATH)
    return states, frame_log_probs, _OK


def _viterbi_numba_source(lp, y):  # pragma: no cover - compiled by numba
    """NeMo's recurrence, one cell at a time, float32 throughout."""
    num_frames, vocab = lp.shape
    num_states = y.shape[0]
    blank = y[0]
    no_states = np.zeros(0, dtype=np.int32)
    no_scores = np.zeros(0, dtype=np.float32)
    repeats = 0
    for u in range(1, num_states, 2):
        if y[u] < 0 or y[u] >= vocab or y[u] == blank:
            return no_states, no_scores, 1  # _BAD_TOKEN
        if u >= 3 and y[u] == y[u - 2]:
            repeats += 1
    if num_frames == 0 or num_frames < num_states // 2 + repeats:
        return no_states, no_scores, 2  # _TOO_FEW_FRAMES
    # lp[:, y] is gathered a block of frames at a time: a tight gather loop is several times faster
    # than reading lp[t, y[u]] inside the recurrence, and the block keeps memory at O(U), not O(T U)
    block = 64
    emissions = np.empty((block, num_states), dtype=np.float32)
    pad = np.float32(-3.4e38)
    skip = np.zeros(num_states, dtype=np.bool_)
    for u in range(2, num_states):
        skip[u] = y[u] != y[u - 2]
    v = np.empty(num_states, dtype=np.float32)
    nv = np.empty(num_states, dtype=np.float32)
    for u in range(num_states):
        v[u] = pad
    for u in range(num_states):
        e = lp[0, y[u]]
        if np.isnan(e):
            return no_states, no_scores, 3  # _NAN
        if u < 2:
            v[u] = e
    backpointers = np.empty((num_frames, num_states), dtype=np.int8)
    for t in range(1, num_frames):
        row = (t - 1) % block
        if row == 0:
            for r in range(min(block, num_frames - t)):
                for u in range(num_states):
                    emissions[r, u] = lp[t + r, y[u]]
            for r in range(min(block, num_frames - t)):
                for u in range(num_states):
                    if np.isnan(emissions[r, u]):
                        return no_states, no_scores, 3  # _NAN
        for u in range(num_states):
            e = emissions[row, u]
            best = v[u] + e
            b = 0
            c1 = (v[u - 1] if u >= 1 else pad) + e
            if c1 > best:
                best = c1
                b = 1
            c2 = (v[u - 2] if skip[u] else pad) + e
            if c2 > best:
                best = c2
                b = 2
            nv[u] = best
            backpointers[t, u] = b
        v, nv = nv, v
    u = 0
    if num_states > 1:
        u = num_states - 2 if v[num_states - 2] >= v[num_states - 1] else num_states - 1
    states = np.empty(num_frames, dtype=np.int32)
    frame_log_probs = np.empty(num_frames, dtype=np.float32)
    states[num_frames - 1] = u
    frame_log_probs[num_frames - 1] = lp[num_frames - 1, y[u]]
    finite = frame_log_probs[num_frames - 1] != -np.inf
    for t in range(num_frames - 1, 0, -1):
        u -= backpointers[t, u]
        states[t - 1] = u
        frame_log_probs[t - 1] = lp[t - 1, y[u]]
        finite &= frame_log_probs[t - 1] != -np.inf
    if states[0] > 1 or not finite:
        return no_states, no_scores, 4  # _NO_FINITE_PATH
    return states, frame_log_probs, 0  # _OK


_numba_lock = threading.Lock()
_numba_kernel: Kernel | None = None
_numba_error: BaseException | None = None


def _load_numba() -> Kernel | None:
    """Compile the kernel once per process (cached on disk by numba when the package is writable)."""
    global _numba_kernel, _numba_error
    with _numba_lock:
        if _numba_kernel is None and _numba_error is None:
            try:
                import numba

                signature = "Tuple((int32[::1], float32[::1], int64))(float32[:, ::1], int64[::1])"
                try:
                    _numba_kernel = numba.njit(signature, nogil=True, cache=True)(_viterbi_numba_source)
                except Exception:  # an unwritable cache directory: compile without caching
                    _numba_kernel = numba.njit(signature, nogil=True)(_viterbi_numba_source)
            except Exception as error:  # numba missing or broken: numpy fallback
                _numba_error = error
        return _numba_kernel


def _kernel(backend: str) -> Kernel:
    if backend == "numpy":
        return _viterbi_numpy
    if backend not in ("auto", "numba"):
        raise ValueError(f"backend must be 'auto', 'numba' or 'numpy'; got {backend!r}")
    kernel = _load_numba()
    if kernel is not None:
        return kernel
    if backend == "numba":
        raise RuntimeError(f"numba backend unavailable: {_numba_error!r}")
    return _viterbi_numpy


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
