"""speechdata.alignment.viterbi against NeMo's ``viterbi_decoding`` (the reference), plus its own contract.

NeMo runs in its own environment (``.venv-nemo``, tests/nemo_env.py): the ``nemo_paths`` fixture
hands every reference case of this module to one NeMo process (~30 s to import) and keeps its paths.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from speechdata.alignment.viterbi import (
    AlignmentImpossible,
    ViterbiPath,
    count_repeats,
    ctc_viterbi,
    ctc_viterbi_many,
    state_tokens,
)
from tests.nemo_env import run_in_nemo_env

BACKENDS = ["numba", "numpy"]
RANDOM_SEEDS = [0, 1, 2, 3]


def random_log_probs(rng: np.random.Generator, T: int, V: int, scale: float = 1.0) -> torch.Tensor:
    logits = torch.from_numpy((scale * rng.standard_normal((T, V))).astype(np.float32))
    return torch.log_softmax(logits, dim=-1)


def random_targets(rng: np.random.Generator, L: int, V: int, blank: int, repeat_p: float) -> np.ndarray:
    """L token ids != blank; each token copies the previous one with probability ``repeat_p``."""
    ids = np.array([i for i in range(V) if i != blank])
    tokens = rng.choice(ids, size=L)
    for k in range(1, L):
        if rng.random() < repeat_p:
            tokens[k] = tokens[k - 1]
    return tokens


def path_log_prob(log_probs: torch.Tensor, targets, blank: int, states: np.ndarray) -> float:
    y = np.asarray(state_tokens(targets, blank))
    lp = log_probs.numpy().astype(np.float64)
    return float(lp[np.arange(len(states)), y[states]].sum())


def assert_valid_path(states: np.ndarray, targets, blank: int) -> None:
    y = np.asarray(state_tokens(targets, blank))
    U = len(y)
    assert states[0] in (0, 1) if U > 1 else states[0] == 0
    assert states[-1] in (U - 1, U - 2) if U > 1 else states[-1] == 0
    steps = np.diff(states)
    assert set(steps.tolist()) <= {0, 1, 2}
    for t in np.nonzero(steps == 2)[0]:
        u = states[t + 1]
        assert y[u] != y[u - 2], f"skip into state {u} at frame {t + 1} jumps over a needed blank"


def assert_same_as_nemo(path: ViterbiPath, reference: np.ndarray, log_probs, targets, blank, label: str) -> None:
    if not np.array_equal(path.states, reference):
        ours = path_log_prob(log_probs, targets, blank, path.states)
        theirs = path_log_prob(log_probs, targets, blank, reference)
        first = int(np.argmax(path.states != reference))
        pytest.fail(
            f"{label}: path differs from NeMo from frame {first} "
            f"(ours {ours:.6f}, NeMo {theirs:.6f}, |diff| {abs(ours - theirs):.2e})"
        )


# --- exactness against NeMo --------------------------------------------------------------------


def random_cases(seed: int, count: int):
    """(log_probs, targets, blank) with T in 5..400, V in 5..1025, L in 0..T/2, repeats included."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        T = int(rng.integers(5, 401))
        V = int(rng.choice([5, 17, 129, 1025])) if i % 2 else int(rng.integers(5, 1026))
        L = int(rng.integers(0, T // 2 + 1)) if i % 5 else 0 if i % 10 == 0 else T // 2
        blank = V - 1 if i % 3 else int(rng.integers(0, V))  # NeMo's CTC blank is V - 1; others too
        repeat_p = [0.0, 0.2, 0.6][i % 3]
        targets = random_targets(rng, L, V, blank, repeat_p)
        scale = [1.0, 4.0, 0.2][i % 3]  # flat to peaky posteriors
        yield random_log_probs(rng, T, V, scale), targets, blank


def tight_cases():
    """T == L + repeats exactly (no spare frame) and T one above it: the band edges."""
    rng = np.random.default_rng(7)
    for i in range(12):
        V = 9
        blank = V - 1
        targets = random_targets(rng, int(rng.integers(1, 30)), V, blank, repeat_p=0.4)
        T = len(targets) + count_repeats(targets) + i % 2
        yield random_log_probs(rng, T, V), targets, blank


def tie_cases():
    """Log-probs rounded to halves: many exact float ties."""
    rng = np.random.default_rng(11)
    for _ in range(16):
        T, V = int(rng.integers(10, 120)), int(rng.choice([4, 6, 30]))
        blank = V - 1
        targets = random_targets(rng, int(rng.integers(1, T // 2 + 1)), V, blank, repeat_p=0.3)
        yield torch.round(random_log_probs(rng, T, V, scale=2.0) * 2) / 2, targets, blank


def u1_u2_tie_case():
    n = -20.0
    a, b, blank = 0, 1, 2
    return torch.tensor([[-1.0, n, n], [-1.0, n, -1.0], [n, -1.0, n], [n, -1.0, n]]), [a, b], blank


def empty_targets_case():
    return random_log_probs(np.random.default_rng(6), 37, 11), [], 10


def reference_cases() -> dict[str, tuple[torch.Tensor, list[int], int]]:
    """Every case this module checks against NeMo, by label."""
    cases = {}
    for seed in RANDOM_SEEDS:
        for i, case in enumerate(random_cases(seed, 12)):
            cases[f"seed {seed} case {i}"] = case
    for kind, builder in (("tight", tight_cases), ("tie", tie_cases)):
        for i, case in enumerate(builder()):
            cases[f"{kind} case {i}"] = case
    cases["u1 u2 tie"] = u1_u2_tie_case()
    cases["empty targets"] = empty_targets_case()
    return cases


@pytest.fixture(scope="module")
def nemo_paths(tmp_path_factory) -> dict[str, np.ndarray]:
    """NeMo's path for every :func:`reference_cases` case, from one process in ``.venv-nemo``."""
    cases_path = tmp_path_factory.mktemp("viterbi-reference") / "cases.pt"
    torch.save(
        {
            label: (lp, [int(t) for t in targets], int(blank))
            for label, (lp, targets, blank) in reference_cases().items()
        },
        cases_path,
    )
    paths = run_in_nemo_env("viterbi_reference.py", str(cases_path))
    return {label: np.asarray(states, dtype=np.int64) for label, states in paths.items()}


@pytest.mark.slow
def test_nemo_gives_a_path_for_every_reference_case(nemo_paths):
    cases = reference_cases()
    assert nemo_paths.keys() == cases.keys()
    for label, (lp, _, _) in cases.items():
        assert nemo_paths[label].shape == (lp.shape[0],), label


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", RANDOM_SEEDS)
def test_random_log_probs_match_nemo_exactly(nemo_paths, seed, backend):
    repeats_seen = 0
    for i, (lp, targets, blank) in enumerate(random_cases(seed, 12)):
        label = f"seed {seed} case {i}"
        path = ctc_viterbi(lp, targets, blank, backend=backend)
        assert path.states.dtype == np.int32 and path.states.shape == (lp.shape[0],)
        assert_same_as_nemo(path, nemo_paths[label], lp, targets, blank, label)
        assert_valid_path(path.states, targets, blank)
        repeats_seen += count_repeats(targets)
    assert repeats_seen > 0  # the cases do exercise adjacent repeated tokens


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_tight_alignments_match_nemo(nemo_paths, backend):
    """T == L + repeats exactly (no spare frame) and T one above it: the band edges."""
    for i, (lp, targets, blank) in enumerate(tight_cases()):
        assert lp.shape[0] - len(targets) - count_repeats(targets) == i % 2
        path = ctc_viterbi(lp, targets, blank, backend=backend)
        assert_same_as_nemo(path, nemo_paths[f"tight case {i}"], lp, targets, blank, f"tight case {i}")
        assert_valid_path(path.states, targets, blank)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_exact_ties_break_like_nemo(nemo_paths, backend):
    """Log-probs rounded to halves make many exact float ties; NeMo's tie-breaking must be kept."""
    tied_frames = 0
    for i, (lp, targets, blank) in enumerate(tie_cases()):
        path = ctc_viterbi(lp, targets, blank, backend=backend)
        assert_same_as_nemo(path, nemo_paths[f"tie case {i}"], lp, targets, blank, f"tie case {i}")
        # the ties are real: frames where a target token's log-prob equals the blank's
        columns = lp.numpy()
        tied_frames += int(np.count_nonzero(columns[:, targets] == columns[:, [blank]]))
    assert tied_frames > 100


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_u1_u2_tie_above_stay_takes_u1_like_nemo(nemo_paths, backend):
    """Where the u-1 and u-2 candidates tie and beat "stay", NeMo takes u-1.

    torchaudio 2.11's CPU forced_align falls back to "stay" here and returns labels a, b, b, b
    (log-prob -23); the best path, NeMo's, is a, blank, b, b (log-prob -4).
    """
    lp, targets, blank = u1_u2_tie_case()
    path = ctc_viterbi(lp, targets, blank, backend=backend)
    assert path.states.tolist() == [1, 2, 3, 3]
    assert path.states.tolist() == nemo_paths["u1 u2 tie"].tolist()
    assert path.total_log_prob == pytest.approx(-4.0)


def test_long_utterance_numba_and_numpy_agree():
    """A 2,000-frame, 600-token utterance: both backends, same path, valid (no NeMo: too slow)."""
    rng = np.random.default_rng(5)
    V = 1025
    targets = random_targets(rng, 600, V, V - 1, repeat_p=0.05)
    lp = random_log_probs(rng, 2000, V, scale=3.0)
    fast = ctc_viterbi(lp, targets, V - 1, backend="numba")
    slow = ctc_viterbi(lp, targets, V - 1, backend="numpy")
    assert np.array_equal(fast.states, slow.states)
    assert np.array_equal(fast.frame_log_probs, slow.frame_log_probs)
    assert_valid_path(fast.states, targets, V - 1)


# --- the path object ------------------------------------------------------------------------------


def peaked(labels: list[int], V: int, high: float = 0.0, low: float = -10.0) -> torch.Tensor:
    """Log-probs whose best label at frame t is labels[t] (``high``), every other one ``low``."""
    lp = torch.full((len(labels), V), low)
    lp[torch.arange(len(labels)), torch.tensor(labels)] = high
    return lp


def test_token_frame_spans_hand_made():
    a, b, c, blank = 0, 1, 2, 3
    # frames:  0      1  2  3      4  5      6  7  8  9
    labels = [blank, a, a, blank, b, blank, b, b, c, blank]
    path = ctc_viterbi(peaked(labels, 4), [a, b, b, c], blank)
    assert path.states.tolist() == [0, 1, 1, 2, 3, 4, 5, 5, 7, 8]
    assert path.token_frame_spans() == [(1, 3), (4, 5), (6, 8), (8, 9)]
    assert path.num_tokens == 4 and path.num_frames == 10
    assert path.total_log_prob == 0.0 and path.score == 0.0


def test_token_frame_spans_cover_each_token_in_order():
    rng = np.random.default_rng(3)
    V = 50
    targets = random_targets(rng, 40, V, V - 1, repeat_p=0.3)
    path = ctc_viterbi(random_log_probs(rng, 150, V), targets, V - 1)
    spans = path.token_frame_spans()
    assert len(spans) == len(targets)
    for k, (first, end) in enumerate(spans):
        assert first < end
        assert set(path.states[first:end].tolist()) == {2 * k + 1}
        if k:
            assert spans[k - 1][1] <= first
    token_frames = sum(end - first for first, end in spans)
    assert token_frames == int(np.count_nonzero(path.states % 2 == 1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_frame_log_probs_are_the_path_emissions(backend):
    rng = np.random.default_rng(4)
    for T, V, L in [(5, 5, 2), (60, 30, 20), (300, 1025, 100)]:
        blank = V - 1
        targets = random_targets(rng, L, V, blank, repeat_p=0.2)
        lp = random_log_probs(rng, T, V)
        path = ctc_viterbi(lp, targets, blank, backend=backend)
        y = np.asarray(state_tokens(targets, blank))
        expected = lp.numpy()[np.arange(T), y[path.states]]
        assert path.frame_log_probs.dtype == np.float32 and path.frame_log_probs.shape == (T,)
        assert np.array_equal(path.frame_log_probs, expected)
        assert path.total_log_prob == pytest.approx(float(expected.astype(np.float64).sum()), abs=1e-9)
        assert path.score == pytest.approx(path.total_log_prob / T)
        assert path.score < 0


def test_path_is_frozen():
    path = ctc_viterbi(peaked([0, 1], 2), [0], 1)
    with pytest.raises(AttributeError):
        path.num_tokens = 3  # type: ignore[misc]


# --- edge cases -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_targets_give_an_all_blank_path(nemo_paths, backend):
    lp, targets, blank = empty_targets_case()
    path = ctc_viterbi(lp, targets, blank, backend=backend)
    assert path.states.tolist() == [0] * 37
    assert path.states.tolist() == nemo_paths["empty targets"].tolist()
    assert np.array_equal(path.frame_log_probs, lp.numpy()[:, 10])
    assert path.token_frame_spans() == [] and path.num_tokens == 0


def test_one_frame():
    assert ctc_viterbi(peaked([2], 3), [], 2).states.tolist() == [0]
    assert ctc_viterbi(peaked([0], 3), [0], 2).states.tolist() == [1]
    assert ctc_viterbi(peaked([2], 3), [0], 2).states.tolist() == [1]  # the token must be emitted


@pytest.mark.parametrize("backend", BACKENDS)
def test_too_few_frames_raise_alignment_impossible(backend):
    a, b, blank = 0, 1, 2
    targets = [a, a, b, b, b]  # L = 5, repeats = 3: needs 8 frames
    with pytest.raises(AlignmentImpossible) as caught:
        ctc_viterbi(torch.zeros(7, 3), targets, blank, backend=backend)
    error = caught.value
    assert isinstance(error, ValueError)
    assert (error.num_frames, error.num_tokens, error.repeats) == (7, 5, 3)
    for part in ("T=7", "L=5", "repeats=3"):
        assert part in str(error)
    assert pickle.loads(pickle.dumps(error)).args == error.args
    path = ctc_viterbi(torch.zeros(8, 3), targets, blank, backend=backend)  # one more frame: exactly enough
    assert path.states.tolist() == [1, 2, 3, 5, 6, 7, 8, 9]
    with pytest.raises(AlignmentImpossible, match="T=0"):
        ctc_viterbi(torch.zeros(0, 3), [], blank, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_finite_path_raises_alignment_impossible(backend):
    lp = peaked([0, 2, 1, 2], 3)
    lp[:, 1] = float("-inf")  # token b can never be emitted
    with pytest.raises(AlignmentImpossible, match="-inf"):
        ctc_viterbi(lp, [0, 1], 2, backend=backend)


def test_malformed_input_is_a_plain_value_error():
    lp = torch.zeros(10, 4)
    for targets, blank in [([0, 3], 3), ([0, 4], 3), ([-1], 3)]:
        with pytest.raises(ValueError) as caught:
            ctc_viterbi(lp, targets, blank)
        assert not isinstance(caught.value, AlignmentImpossible)
    with pytest.raises(ValueError):
        ctc_viterbi(torch.zeros(10), [0], 3)
    with pytest.raises(ValueError):
        ctc_viterbi(lp, [0], 4)
    nan = lp.clone()
    nan[3, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        ctc_viterbi(nan, [0], 3)


def test_input_types_agree():
    rng = np.random.default_rng(8)
    V = 20
    targets = random_targets(rng, 15, V, V - 1, repeat_p=0.2)
    lp = random_log_probs(rng, 50, V)
    expected = ctc_viterbi(lp, targets, V - 1).states
    variants = [
        (lp.numpy(), targets.tolist(), V - 1),
        (lp.double(), torch.tensor(targets), -1),  # float64 is aligned in float32, as NeMo does
        (lp.t().contiguous().t(), targets.astype(np.int32), V - 1),  # non-contiguous input
    ]
    for log_probs, tokens, blank in variants:
        assert np.array_equal(ctc_viterbi(log_probs, tokens, blank).states, expected)


# --- many -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_many_keeps_input_order(workers):
    rng = np.random.default_rng(9)
    items = []
    for _ in range(24):
        T, V = int(rng.integers(20, 200)), 65
        items.append((random_log_probs(rng, T, V), random_targets(rng, T // 3, V, V - 1, 0.1), V - 1))
    results = ctc_viterbi_many(items, workers=workers)
    assert len(results) == len(items)
    for (lp, targets, blank), result in zip(items, results):
        assert np.array_equal(result.states, ctc_viterbi(lp, targets, blank).states)


def test_many_impossible_items():
    ok = (torch.zeros(6, 3), [0, 1], 2)
    bad = (torch.zeros(2, 3), [0, 0], 2)
    with pytest.raises(AlignmentImpossible):
        ctc_viterbi_many([ok, bad, ok], workers=2)
    results = ctc_viterbi_many([ok, bad, ok], workers=2, return_errors=True)
    assert isinstance(results[0], ViterbiPath) and isinstance(results[2], ViterbiPath)
    assert isinstance(results[1], AlignmentImpossible) and results[1].repeats == 1
    assert ctc_viterbi_many([], workers=2) == []
