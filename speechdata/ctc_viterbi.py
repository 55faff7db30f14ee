"""Exact CTC forced-alignment Viterbi, path-compatible with NeMo's ``viterbi_decoding``.

NeMo's aligner (``nemo.collections.asr.parts.utils.aligner_utils.viterbi_decoding``) loops over
frames in Python with a handful of tensor ops per frame (~30 ms for a 250-frame utterance on one
core). This module gets the same path from torchaudio's C++ ``forced_align`` kernel (~0.35 ms) and
converts its per-frame labels into NeMo's state indices.

Conventions (NeMo's): for target tokens ``t_1..t_L`` (no blanks) the states are
``y = [blank, t_1, blank, t_2, ..., blank, t_L, blank]`` (``U = 2L + 1``; empty text: ``U = 1``).
A path gives one state index per frame; moves are stay, ``u + 1`` and ``u + 2`` (the latter only
into a token different from the token two states back, i.e. skipping a blank between different
tokens); the path starts in state 0 or 1 and ends in ``U - 1`` or ``U - 2``. CTC needs a blank
between two adjacent identical tokens, so an alignment exists only when ``T >= L + repeats``
(``repeats`` = number of adjacent equal token pairs); otherwise :class:`AlignmentImpossible`.

Tie-breaking, and the one place the two can differ
--------------------------------------------------
Both pick, among equal candidates, the lowest backpointer (stay before ``u - 1`` before ``u - 2``;
``torch.max`` returns the first maximum, torchaudio's comparisons are strict), and at the last
frame both prefer ``U - 2`` over ``U - 1`` on a tie. Exact ties in the inputs (e.g. quantised
log-probs) therefore give identical paths. The Viterbi scores (alphas) are identical too, since
rounding is monotone: ``max_k fl(x_k + e) == fl(max_k x_k + e)``.

The arithmetic order differs, though: NeMo adds the frame's log-prob first and then takes the max
(``max_k fl(x_k + e)``), torchaudio takes the max and then adds. When two candidate scores
``x_i != x_j`` are within about one float32 ulp of each other and adding ``e`` rounds them to the
same value (only possible when the sum crosses a power of two), NeMo sees a tie and takes the lower
index while torchaudio takes the strictly larger candidate. The two paths then have the same
float32 Viterbi score (the sums differ by about one ulp of the running score, ~1e-4 at -1000), i.e.
they are equally optimal up to float32 rounding; this is the only way the paths can differ. It
needs a near-tie on the chosen path itself and was not seen in 200 benchmark utterances (see
``tests/unit/test_ctc_viterbi.py`` and ``benchmarks/bench_viterbi.py``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
import torch

__all__ = [
    "AlignmentImpossible",
    "ViterbiPath",
    "count_repeats",
    "ctc_viterbi",
    "ctc_viterbi_many",
    "state_tokens",
]

ArrayLike = Union[torch.Tensor, np.ndarray, Sequence[int]]


class AlignmentImpossible(ValueError):
    """The text cannot be CTC-aligned to this many frames (``T < L + repeats``)."""

    def __init__(self, num_frames: int, num_tokens: int, repeats: int):
        self.num_frames = num_frames
        self.num_tokens = num_tokens
        self.repeats = repeats
        super().__init__(
            f"CTC alignment impossible: T={num_frames} frames < L + repeats = {num_tokens} + {repeats} "
            f"= {num_tokens + repeats} (L={num_tokens} target tokens, {repeats} adjacent repeated tokens "
            f"each needing a blank frame between them)"
        )

    def __reduce__(self):  # keep the exception picklable (process pools, Dagster events)
        return (type(self), (self.num_frames, self.num_tokens, self.repeats))


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
        """Sum of the frame log-probs along the path (the Viterbi path score)."""
        return float(np.sum(self.frame_log_probs, dtype=np.float64))

    @property
    def score(self) -> float:
        """Mean frame log-prob along the path."""
        return self.total_log_prob / self.num_frames

    def token_frame_spans(self) -> list[tuple[int, int]]:
        """``(first_frame, last_frame_exclusive)`` of each target token (state ``2k + 1``), in order.

        Every token occupies at least one frame on a valid path, and its frames are contiguous since
        the path never moves backwards.
        """
        if self.num_tokens == 0:
            return []
        token_states = 2 * np.arange(self.num_tokens, dtype=np.int64) + 1
        starts = np.searchsorted(self.states, token_states, side="left")
        ends = np.searchsorted(self.states, token_states, side="right")
        return [(int(s), int(e)) for s, e in zip(starts, ends)]


def state_tokens(targets: ArrayLike, blank: int) -> list[int]:
    """NeMo's interleaved state labels ``[blank, t_1, blank, ..., t_L, blank]`` (``y_batch[0]``)."""
    y = [int(blank)]
    for token in _targets_array(targets).tolist():
        y += [token, int(blank)]
    return y


def count_repeats(targets: ArrayLike) -> int:
    """Number of adjacent equal token pairs (each needs an extra blank frame)."""
    t = _targets_array(targets)
    return int(np.count_nonzero(t[1:] == t[:-1])) if t.size > 1 else 0


def ctc_viterbi(log_probs: ArrayLike, targets: ArrayLike, blank: int) -> ViterbiPath:
    """Best CTC path of ``targets`` through ``log_probs`` (float [T, V]), NeMo's state indices.

    ``blank`` is the blank's column (NeMo's CTC models: ``V - 1``; a negative index counts from
    the end). Raises :class:`AlignmentImpossible` when ``T < L + repeats`` (also for ``T == 0``),
    and plain ``ValueError`` for malformed input (wrong shapes, a blank or out-of-range id in
    ``targets``, non-finite log-probs are *not* checked).
    """
    lp = _log_probs_tensor(log_probs)
    num_frames, vocab = int(lp.shape[0]), int(lp.shape[1])
    blank = _blank_index(blank, vocab)
    tokens = _targets_array(targets)
    num_tokens = int(tokens.size)
    if num_tokens:
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= vocab:
            raise ValueError(f"target ids must lie in [0, {vocab}); got min {low}, max {high}")
        if np.any(tokens == blank):
            raise ValueError(f"targets must not contain the blank id {blank}")
    repeats = count_repeats(tokens)
    if num_frames == 0 or num_frames < num_tokens + repeats:
        raise AlignmentImpossible(num_frames, num_tokens, repeats)

    lp_np = lp.numpy()
    if num_tokens == 0:
        states = np.zeros(num_frames, dtype=np.int32)
        labels = np.full(num_frames, blank, dtype=np.int64)
    else:
        labels = _forced_align_labels(lp, tokens, blank)
        states = _labels_to_states(labels, tokens, blank)
    frame_log_probs = lp_np[np.arange(num_frames), labels].astype(np.float32, copy=False)
    return ViterbiPath(states=states, frame_log_probs=frame_log_probs, num_tokens=num_tokens)


def ctc_viterbi_many(
    items: Iterable[tuple[ArrayLike, ArrayLike, int]],
    workers: int = 1,
    *,
    return_errors: bool = False,
) -> list[ViterbiPath | AlignmentImpossible]:
    """:func:`ctc_viterbi` over ``(log_probs, targets, blank)`` items, results in input order.

    ``workers > 1`` runs on a thread pool: torchaudio's kernel releases the GIL, and threads avoid
    pickling the [T, V] log-probs to another process (which costs more than the alignment itself);
    two threads align ~1.7x as many utterances per second as one on two cores.
    With ``return_errors`` an :class:`AlignmentImpossible` is put in the result list in place of
    that item's path; otherwise the first one (in input order) is raised.
    """
    items = list(items)
    workers = max(1, min(int(workers), len(items) or 1, os.cpu_count() or 1))

    def one(item: tuple[ArrayLike, ArrayLike, int]) -> ViterbiPath | AlignmentImpossible:
        log_probs, targets, blank = item
        try:
            return ctc_viterbi(log_probs, targets, blank)
        except AlignmentImpossible as error:
            if return_errors:
                return error
            raise

    if workers == 1:
        return [one(item) for item in items]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ctc_viterbi") as pool:
        return list(pool.map(one, items))


# --- internals ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _forced_align_op() -> Any:
    """torchaudio's CPU kernel, called directly: the Python wrapper's checks cost more than it."""
    import torchaudio.functional  # noqa: F401  (loads libtorchaudio and registers the op)

    return torch.ops.torchaudio.forced_align


def _forced_align_labels(lp: torch.Tensor, tokens: np.ndarray, blank: int) -> np.ndarray:
    num_frames = lp.shape[0]
    targets = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64)).unsqueeze(0)
    paths, _ = _forced_align_op()(
        lp.unsqueeze(0),
        targets,
        torch.tensor([num_frames], dtype=torch.int64),
        torch.tensor([tokens.size], dtype=torch.int64),
        blank,
    )
    return paths[0].numpy()


def _labels_to_states(labels: np.ndarray, tokens: np.ndarray, blank: int) -> np.ndarray:
    """Per-frame labels -> NeMo state indices (token ``k`` -> ``2k + 1``, blank after it -> ``2k + 2``).

    A non-blank frame starts a new token unless the previous frame emitted the same label (the same
    token held: two identical adjacent tokens always have a blank frame between them on a CTC path).
    """
    is_token = labels != blank
    new_token = is_token.copy()
    new_token[1:] &= ~(is_token[:-1] & (labels[1:] == labels[:-1]))
    k = np.cumsum(new_token, dtype=np.int64) - 1  # index of the latest token started
    states = np.where(is_token, 2 * k + 1, 2 * k + 2).astype(np.int32)
    if int(k[-1]) + 1 != tokens.size or not np.array_equal(labels[new_token], tokens):
        raise RuntimeError("forced_align returned a path that does not spell the targets")
    return states


def _log_probs_tensor(log_probs: ArrayLike) -> torch.Tensor:
    lp = log_probs if isinstance(log_probs, torch.Tensor) else torch.from_numpy(np.asarray(log_probs))
    if lp.dim() != 2:
        raise ValueError(f"log_probs must be 2-D [T, V]; got shape {tuple(lp.shape)}")
    lp = lp.detach().cpu()
    if lp.dtype not in (torch.float32, torch.float64):
        lp = lp.to(torch.float32)
    return lp.contiguous()


def _targets_array(targets: ArrayLike) -> np.ndarray:
    if isinstance(targets, torch.Tensor):
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
