"""CTC forced alignment of long recordings in bounded memory, with an optional wildcard.

**Bounded memory (checkpointed Viterbi).** The whole-matrix Viterbi
(:func:`speechdata.alignment.viterbi.ctc_viterbi`) keeps one back-pointer byte per frame and state,
``T x U`` with ``U = 2L + 1``: a 2-hour recording (90 000 frames of 80 ms) with a 17 280-word
transcript (~100 000 character tokens) would need ~18 GB. This module runs the *same* recurrence
(float32, NeMo's tie-breaking, cell for cell) but keeps only the score column ``v`` at every
``K``-th frame (a checkpoint, ``4 U`` bytes each). The backtrace then walks the blocks from the last
to the first: each block's back-pointers (``K x U`` bytes) are recomputed from its checkpoint, the
path is traced through the block, and the block's memory is reused for the one before. Memory is
``(T / K) x 4U + K x U`` bytes (with ``K ~ 2 sqrt(T)``: ~``4 sqrt(T) U``, 75 MB for 2 h and
U = 50 000 where the whole matrix takes 4.5 GB); time is about twice the whole-matrix kernel's (every
cell is computed once forward and once more in its block). Because the recomputation repeats the
same float32 operations, the path is identical, state for state, to the whole-matrix Viterbi's
(and so to NeMo's): word timings are not approximately but exactly those of aligning the recording
whole. ``tests/unit/test_long_form_alignment.py`` checks it on the tiny model's log-probs and on
synthetic log-probs with a known path.

**Wildcard.** A stretch of audio the transcript does not cover (music, an intro, a speaker the
transcript skips) otherwise has to be explained by the transcript's own tokens or blanks, and the
words around it drift into it. As in torchaudio's and ctc-forced-aligner's ``<star>``, a wildcard
may explain such frames: at the blank states that separate words (the word-boundary blanks: before
the first word, after the last, and between two words; where it may go is the caller's choice, see
:data:`WILDCARD_PLACEMENTS` in :mod:`speechdata.alignment.forced`), a frame's emission is the better
of the blank's log-prob and the wildcard's, ``max_v log_probs[t, v] - penalty``. The wildcard thus
costs ``penalty`` nats per frame more than the model's best explanation of that frame: where the
model is confident (speech it transcribes, silence it calls blank) the wildcard never wins, and where
it emits something the transcript lacks it absorbs those frames instead of dragging words there. Unlike
a ``<star>`` token it needs no frame of its own where nothing is uncovered (it rides on an optional
blank), so an utterance without uncovered stretches keeps its path. Frames explained by the wildcard
are returned (``wildcard_frames``) and reported as stretches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from speechdata.alignment.kernels import OK, PADDING_VALUE, NumbaKernel
from speechdata.alignment.viterbi import (
    ArrayLike,
    ViterbiPath,
    _blank_index,
    _log_probs_array,
    _raise_for,
    _targets_array,
)

__all__ = [
    "DEFAULT_WILDCARD_PENALTY",
    "LongFormPath",
    "checkpoint_frames_for",
    "checkpointed_memory_bytes",
    "ctc_viterbi_checkpointed",
    "wildcard_stretches",
]

DEFAULT_WILDCARD_PENALTY = 1.0
"""Nats per frame the wildcard costs beyond the model's best label for that frame (see the module
docstring): large enough that it never takes frames the model explains confidently, small enough
that it takes frames whose best label the transcript lacks, which the transcript's tokens would
otherwise pay several nats a frame to cover."""

_EMISSION_BLOCK = 64
"""Frames whose emissions are gathered at once (as in the whole-matrix kernel)."""


@dataclass(frozen=True)
class LongFormPath(ViterbiPath):
    """A :class:`ViterbiPath` plus, per frame, whether the wildcard explained it.

    ``frame_log_probs`` stay the log-probs of the path's own labels (the blank on a wildcard frame),
    so ``score`` still says how well the *transcript* explains the audio: a stretch the wildcard
    absorbs lowers it as before, and is reported apart (``wildcard_frames``) rather than hidden."""

    wildcard_frames: np.ndarray
    """np.bool_ [T]: the frame sits in a word-boundary state and its emission is the wildcard's."""


def checkpoint_frames_for(num_frames: int) -> int:
    """The checkpoint interval ``K`` that roughly minimises ``(T / K) x 4 + K`` bytes per state."""
    return max(_EMISSION_BLOCK, int(math.ceil(2.0 * math.sqrt(max(num_frames, 1)))))


def checkpointed_memory_bytes(num_frames: int, num_tokens: int, checkpoint_frames: int | None = None) -> int:
    """Bytes the checkpointed Viterbi allocates for ``T`` frames and ``L`` tokens (beyond the log-probs)."""
    num_states = 2 * num_tokens + 1
    interval = checkpoint_frames or checkpoint_frames_for(num_frames)
    checkpoints = -(-num_frames // interval)
    per_state = 4 * checkpoints + interval + 4 * _EMISSION_BLOCK + 4 * 4  # + v, next v, skip, gap
    return num_states * per_state + num_frames * (4 + 4 + 1 + 4)  # states, frame log-probs, wildcard, star


def ctc_viterbi_checkpointed(
    log_probs: ArrayLike,
    targets: ArrayLike,
    blank: int,
    *,
    wildcard_gaps: Sequence[int] | None = None,
    wildcard_penalty: float = DEFAULT_WILDCARD_PENALTY,
    checkpoint_frames: int | None = None,
    backend: str = "auto",
) -> LongFormPath:
    """The best CTC path of ``targets`` through ``log_probs`` [T, V], in ``O(sqrt(T) U)`` memory.

    Without ``wildcard_gaps`` the path is :func:`~speechdata.alignment.viterbi.ctc_viterbi`'s, state
    for state. ``wildcard_gaps``: the positions ``k`` in ``0..L`` (the blank before target ``k``;
    ``L`` is the final blank) where the wildcard may explain frames, at ``wildcard_penalty`` nats a
    frame below the frame's best log-prob. ``checkpoint_frames``: ``K`` (default
    :func:`checkpoint_frames_for`); ``K >= T`` keeps the whole matrix. Raises what ``ctc_viterbi``
    raises, for the same input.
    """
    lp = _log_probs_array(log_probs)
    num_frames, vocab = lp.shape
    blank = _blank_index(blank, vocab)
    tokens = _targets_array(targets)
    num_tokens = int(tokens.size)
    y = np.full(2 * num_tokens + 1, blank, dtype=np.int64)
    y[1::2] = tokens
    skip = np.zeros(y.shape[0], dtype=np.bool_)
    skip[2:] = y[2:] != y[:-2]
    gap = np.zeros(y.shape[0], dtype=np.bool_)
    if wildcard_gaps:
        positions = np.asarray(list(wildcard_gaps), dtype=np.int64)
        if positions.min() < 0 or positions.max() > num_tokens:
            raise ValueError(f"wildcard positions must lie in [0, {num_tokens}]")
        gap[2 * positions] = True
        if not math.isfinite(wildcard_penalty) or wildcard_penalty < 0:
            raise ValueError(f"wildcard_penalty must be a finite number >= 0; got {wildcard_penalty}")
        with np.errstate(invalid="ignore"):
            star = (np.max(lp, axis=1) - np.float32(wildcard_penalty)).astype(np.float32)
        # a frame whose best log-prob is NaN must not pass as a wildcard: NaN is reported from the columns
        star[np.isnan(star)] = -np.inf
    else:
        star = np.full(num_frames, -np.inf, dtype=np.float32)
    interval = int(checkpoint_frames or checkpoint_frames_for(num_frames))
    if interval < 1:
        raise ValueError(f"checkpoint_frames must be >= 1; got {checkpoint_frames}")
    states, frame_log_probs, wild, status = _kernel_for(backend)(lp, y, skip, gap, star, interval)
    if status != OK:
        _raise_for(status, num_frames, vocab, tokens, blank)
    return LongFormPath(
        states=states, frame_log_probs=frame_log_probs, num_tokens=num_tokens, wildcard_frames=wild.astype(np.bool_)
    )


def wildcard_stretches(wildcard_frames: np.ndarray, min_frames: int = 1) -> list[tuple[int, int]]:
    """``(first_frame, last_frame_exclusive)`` of each run of wildcard frames at least ``min_frames`` long."""
    flags = np.concatenate([[False], np.asarray(wildcard_frames, dtype=np.bool_), [False]])
    edges = np.flatnonzero(flags[1:] != flags[:-1])
    return [(int(s), int(e)) for s, e in zip(edges[::2], edges[1::2], strict=True) if e - s >= min_frames]


# --- kernels --------------------------------------------------------------------------------------
# Both take lp float32 [T, V], y int64 [U] (state labels), skip bool [U] (u - 2 -> u allowed), gap
# bool [U] (the wildcard may explain this state's frames), star float32 [T] (the wildcard's log-prob
# per frame) and the checkpoint interval, and return (states, frame_log_probs, wildcard, status) with
# the status codes of speechdata.alignment.kernels.


def _checkpointed_numpy(lp, y, skip, gap, star, interval):
    """The recurrence vectorised over states, one numpy step per frame (the fallback without numba)."""
    num_frames, vocab = lp.shape
    empty = (np.zeros(0, np.int32), np.zeros(0, np.float32), np.zeros(0, np.uint8))
    tokens = y[1::2]
    if np.any((tokens < 0) | (tokens >= vocab) | (tokens == y[0])):
        return (*empty, 1)
    repeats = int(np.count_nonzero(tokens[1:] == tokens[:-1]))
    if num_frames == 0 or num_frames < tokens.size + repeats:
        return (*empty, 2)
    if np.isnan(lp[:, np.unique(y)]).any():  # the distinct columns: [T, U] would not be bounded
        return (*empty, 3)
    recurrence = _NumpyRecurrence(lp, y, skip, gap, star)
    with np.errstate(over="ignore", invalid="ignore"):
        states = recurrence.path(interval)
    raw = lp[np.arange(num_frames), y[states]]
    wild = gap[states] & (star > raw)
    if states[0] > 1 or np.isneginf(np.where(wild, star, raw)).any():
        return (*empty, 4)
    return states, raw.astype(np.float32), wild.astype(np.uint8), OK


class _NumpyRecurrence:
    def __init__(self, lp, y, skip, gap, star):
        self.lp, self.y, self.gap, self.star, self.no_skip = lp, y, gap, star, ~skip

    def emissions(self, t: int) -> np.ndarray:
        e = self.lp[t, self.y]
        return np.where(self.gap & (self.star[t] > e), self.star[t], e)

    def first(self) -> np.ndarray:
        v = np.full(self.y.shape[0], PADDING_VALUE, np.float32)
        v[:2] = self.emissions(0)[:2]
        return v

    def step(self, v: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
        e = self.emissions(t)
        prev1 = np.full_like(v, PADDING_VALUE)
        prev2 = np.full_like(v, PADDING_VALUE)
        prev1[1:] = v[:-1]
        prev2[2:] = v[:-2]
        prev2[self.no_skip] = PADDING_VALUE
        c0, c1, c2 = v + e, prev1 + e, prev2 + e
        take1 = c1 > c0
        best = np.where(take1, c1, c0)
        take2 = c2 > best
        return np.where(take2, c2, best).astype(np.float32), np.where(take2, 2, take1).astype(np.int8)

    def path(self, interval: int) -> np.ndarray:
        num_frames, num_states = self.lp.shape[0], self.y.shape[0]
        checkpoints = []
        v = self.first()
        for t in range(1, num_frames):
            if t % interval == 0:
                checkpoints.append(v)
            v, _ = self.step(v, t)
        u = 0 if num_states == 1 else num_states - 2 if v[num_states - 2] >= v[num_states - 1] else num_states - 1
        states = np.empty(num_frames, np.int32)
        states[-1] = u
        for block in range((num_frames - 1) // interval, -1, -1):
            first, stop = block * interval, min((block + 1) * interval, num_frames)
            v, start = (self.first(), 1) if block == 0 else (checkpoints[block - 1], first)
            pointers = np.zeros((stop - first, num_states), np.int8)
            for t in range(start, stop):
                v, pointers[t - first] = self.step(v, t)
            for t in range(stop - 1, max(first, 1) - 1, -1):
                u -= int(pointers[t - first, u])
                states[t - 1] = u
        return states


# C901 waived: numba compiles this loop nest whole; it is the whole-matrix kernel's recurrence
# (speechdata.alignment.kernels) with the checkpoints and the wildcard's emission added.
def _checkpointed_numba_source(lp, y, skip, gap, star, interval):  # noqa: C901  # pragma: no cover - numba
    num_frames, vocab = lp.shape
    num_states = y.shape[0]
    blank = y[0]
    no_states = np.zeros(0, dtype=np.int32)
    no_scores = np.zeros(0, dtype=np.float32)
    no_wild = np.zeros(0, dtype=np.uint8)
    repeats = 0
    for u in range(1, num_states, 2):
        if y[u] < 0 or y[u] >= vocab or y[u] == blank:
            return no_states, no_scores, no_wild, 1  # BAD_TOKEN
        if u >= 3 and y[u] == y[u - 2]:
            repeats += 1
    if num_frames == 0 or num_frames < num_states // 2 + repeats:
        return no_states, no_scores, no_wild, 2  # TOO_FEW_FRAMES
    block = 64
    emissions = np.empty((block, num_states), dtype=np.float32)
    pad = np.float32(-3.4e38)
    v = np.empty(num_states, dtype=np.float32)
    nv = np.empty(num_states, dtype=np.float32)
    for u in range(num_states):
        e = lp[0, y[u]]
        if np.isnan(e):
            return no_states, no_scores, no_wild, 3  # NAN
    n_checkpoints = (num_frames - 1) // interval
    checkpoints = np.empty((n_checkpoints, num_states), dtype=np.float32)
    pointers = np.empty((min(interval, num_frames), num_states), dtype=np.int8)
    # pass 0 runs forward over every frame, storing checkpoints; pass b >= 1 recomputes block
    # (n_checkpoints + 1 - b) and traces the path back through it
    states = np.empty(num_frames, dtype=np.int32)
    u_end = 0
    for run in range(n_checkpoints + 2):
        if run == 0:
            first, stop, store = 0, num_frames, False
        else:
            b = n_checkpoints + 1 - run
            first, stop, store = b * interval, min((b + 1) * interval, num_frames), True
        if first == 0:
            for u in range(num_states):
                v[u] = pad
            for u in range(min(2, num_states)):
                e = lp[0, y[u]]
                if gap[u] and star[0] > e:
                    e = star[0]
                v[u] = e
            start = 1
        else:
            for u in range(num_states):
                v[u] = checkpoints[first // interval - 1, u]
            start = first
        for t in range(start, stop):
            if not store and t % interval == 0:
                for u in range(num_states):
                    checkpoints[t // interval - 1, u] = v[u]
            row = (t - start) % block
            if row == 0:
                for r in range(min(block, stop - t)):
                    for u in range(num_states):
                        e = lp[t + r, y[u]]
                        if gap[u] and star[t + r] > e:
                            e = star[t + r]
                        emissions[r, u] = e
                if not store:
                    for r in range(min(block, stop - t)):
                        for u in range(num_states):
                            if np.isnan(emissions[r, u]):
                                return no_states, no_scores, no_wild, 3  # NAN
            # two copies of the cell loop, so that the forward pass has no store in it
            if store:
                p = t - first
                for u in range(num_states):
                    e = emissions[row, u]
                    best = v[u] + e
                    bp = 0
                    c1 = (v[u - 1] if u >= 1 else pad) + e
                    if c1 > best:
                        best = c1
                        bp = 1
                    c2 = (v[u - 2] if skip[u] else pad) + e
                    if c2 > best:
                        best = c2
                        bp = 2
                    nv[u] = best
                    pointers[p, u] = bp
            else:
                for u in range(num_states):
                    e = emissions[row, u]
                    best = v[u] + e
                    c1 = (v[u - 1] if u >= 1 else pad) + e
                    if c1 > best:
                        best = c1
                    c2 = (v[u - 2] if skip[u] else pad) + e
                    if c2 > best:
                        best = c2
                    nv[u] = best
            v, nv = nv, v
        if run == 0:
            u_end = 0
            if num_states > 1:
                u_end = num_states - 2 if v[num_states - 2] >= v[num_states - 1] else num_states - 1
            states[num_frames - 1] = u_end
            continue
        u = states[stop - 1]
        for t in range(stop - 1, max(first, 1) - 1, -1):
            u -= pointers[t - first, u]
            states[t - 1] = u
    frame_log_probs = np.empty(num_frames, dtype=np.float32)
    wild = np.zeros(num_frames, dtype=np.uint8)
    finite = True
    for t in range(num_frames):
        u = states[t]
        e = lp[t, y[u]]
        frame_log_probs[t] = e
        if gap[u] and star[t] > e:
            e = star[t]
            wild[t] = 1
        finite &= e != -np.inf
    if states[0] > 1 or not finite:
        return no_states, no_scores, no_wild, 4  # NO_FINITE_PATH
    return states, frame_log_probs, wild, 0  # OK


Kernel = Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray, int]]
_CHECKPOINTED = NumbaKernel(
    _checkpointed_numba_source,
    "Tuple((int32[::1], float32[::1], uint8[::1], int64))"
    "(float32[:, ::1], int64[::1], boolean[::1], boolean[::1], float32[::1], int64)",
    _checkpointed_numpy,
)


def _kernel_for(backend: str) -> Kernel:
    return _CHECKPOINTED.for_backend(backend)
