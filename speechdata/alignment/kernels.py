"""The CTC Viterbi recurrence as kernels: compiled with numba (``nogil``), and vectorised numpy.

Both take ``lp`` float32 [T, V] (C-contiguous) and ``y`` int64 [U] (NeMo's state labels: blank at
even positions, U >= 1) and return ``(states int32 [T], frame_log_probs float32 [T], status)``;
they validate their input in the same pass and report problems as a status code, which
:mod:`speechdata.alignment.viterbi` (the driver) turns into an explained error. The arithmetic and
tie-breaking that make the path NeMo's are described there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

#: NeMo's ``padding_value`` (a float32 tensor filled with it holds -3.4e38 rounded to float32).
PADDING_VALUE = np.float32(-3.4e38)

OK, BAD_TOKEN, TOO_FEW_FRAMES, NAN, NO_FINITE_PATH = 0, 1, 2, 3, 4
"""Kernel status codes; the states are meaningful only with ``OK``."""

Kernel = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, int]]


def _viterbi_numpy(lp: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """NeMo's recurrence vectorised over states, one numpy step per frame."""
    num_frames, vocab = lp.shape
    num_states = y.shape[0]
    empty = (np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32))
    tokens = y[1::2]
    if np.any((tokens < 0) | (tokens >= vocab) | (tokens == y[0])):
        return (*empty, BAD_TOKEN)
    repeats = int(np.count_nonzero(tokens[1:] == tokens[:-1]))
    if num_frames == 0 or num_frames < tokens.size + repeats:
        return (*empty, TOO_FEW_FRAMES)
    emissions = lp[:, y]
    if np.isnan(emissions).any():
        return (*empty, NAN)
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
        return (*empty, NO_FINITE_PATH)
    return states, frame_log_probs, OK


# C901 waived: numba compiles this one loop nest whole into the kernel, kept cell for cell with
# NeMo's recurrence so the two read side by side; its branches are that recurrence's cases.
def _viterbi_numba_source(lp, y):  # noqa: C901  # pragma: no cover - compiled by numba
    """NeMo's recurrence, one cell at a time, float32 throughout."""
    num_frames, vocab = lp.shape
    num_states = y.shape[0]
    blank = y[0]
    no_states = np.zeros(0, dtype=np.int32)
    no_scores = np.zeros(0, dtype=np.float32)
    repeats = 0
    for u in range(1, num_states, 2):
        if y[u] < 0 or y[u] >= vocab or y[u] == blank:
            return no_states, no_scores, 1  # BAD_TOKEN
        if u >= 3 and y[u] == y[u - 2]:
            repeats += 1
    if num_frames == 0 or num_frames < num_states // 2 + repeats:
        return no_states, no_scores, 2  # TOO_FEW_FRAMES
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
            return no_states, no_scores, 3  # NAN
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
                        return no_states, no_scores, 3  # NAN
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
        return no_states, no_scores, 4  # NO_FINITE_PATH
    return states, frame_log_probs, 0  # OK


class NumbaKernel:
    """A numba kernel compiled once per process on first use (cached on disk by numba when the package
    is writable), with its numpy twin for when numba is missing or broken."""

    def __init__(self, source: Callable, signature: str, numpy_kernel: Callable):
        self._source, self._signature, self._numpy_kernel = source, signature, numpy_kernel
        self._lock = threading.Lock()
        self._compiled: Callable | None = None
        self._error: BaseException | None = None

    def _load(self) -> Callable | None:
        with self._lock:
            if self._compiled is None and self._error is None:
                try:
                    import numba

                    try:
                        self._compiled = numba.njit(self._signature, nogil=True, cache=True)(self._source)
                    except Exception:  # an unwritable cache directory: compile without caching
                        self._compiled = numba.njit(self._signature, nogil=True)(self._source)
                except Exception as error:  # numba missing or broken: numpy fallback
                    self._error = error
            return self._compiled

    def for_backend(self, backend: str) -> Callable:
        """The kernel for ``backend`` (``auto``: numba when it loads, else numpy)."""
        if backend == "numpy":
            return self._numpy_kernel
        if backend not in ("auto", "numba"):
            raise ValueError(f"backend must be 'auto', 'numba' or 'numpy'; got {backend!r}")
        kernel = self._load()
        if kernel is not None:
            return kernel
        if backend == "numba":
            raise RuntimeError(f"numba backend unavailable: {self._error!r}")
        return self._numpy_kernel


_VITERBI = NumbaKernel(
    _viterbi_numba_source, "Tuple((int32[::1], float32[::1], int64))(float32[:, ::1], int64[::1])", _viterbi_numpy
)


def kernel_for(backend: str) -> Kernel:
    """The kernel for ``backend`` (``auto``: numba when it loads, else numpy)."""
    return _VITERBI.for_backend(backend)
