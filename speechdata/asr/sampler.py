"""Duration-bucketed, language-balanced, duration-capped batches for DDP ASR training.

One epoch, exactly as the original ASR pipeline's ``DurationBucketBatchSampler`` builds it, in numpy:

1. Bucket every utterance by duration: ``bucket = bisect_right(boundaries_s, duration)``.
2. Weight languages with temperature ``T``: ``p_lang ∝ count_lang ** T`` (``T <= 0``: uniform),
   and give each utterance ``w = p_lang / (count_lang / total)``.
3. Inside each bucket order utterances by ``U ** (1 / max(w, 1e-12))`` descending (``U`` uniform in
   [0, 1)): a weighted random ordering without replacement, heavier languages first. Ties go to the
   larger index, as the original ASR pipeline's ``sort(reverse=True)`` over ``(key, index)`` pairs does.
4. Greedily pack each bucket's ordering into batches: a batch closes when the next utterance would
   take its total past ``max_batch_duration_s`` (a single longer utterance makes a batch of its own).
5. Concatenate the buckets' batches (buckets in order of first appearance, as the original ASR
   pipeline's dict does), sort them stably by cost ``len(batch) * max duration`` descending, keep the
   largest multiple of ``world_size``, and deal them round-robin: rank ``r`` gets batches ``r, r +
   world, ...``.
6. Trim each rank's list to a multiple of ``grad_accum`` and shuffle it.

Randomness: ``np.random.default_rng(seed + epoch)`` draws ``U`` for utterance ``i`` as
``rng.random(n)[i]``, then the rank-local permutation with ``rng.permutation``. Every rank computes
the same global batch list, so ranks agree without communicating.

Durations are compared in integer milliseconds (rounded half up) so that packing is exact: with float
seconds, whether thirty 3.0 s clips fit a 90 s cap would depend on the order of the additions.

A finding about the original algorithm (tests/unit/test_asr_sampler.py shows it): because every
utterance of every bucket is packed, and batches are then re-sorted by cost and shuffled, step 3 changes
*which utterances share a batch* but hardly the language mix of the epoch; only the trimmed tail
(the cheapest batches, where down-weighted languages collect) moves it. ``epoch_fraction < 1`` keeps
only the first fraction of each bucket's weighted ordering, which turns step 3 into real temperature
sampling; ``epoch_fraction = 1`` (the default) is the original algorithm.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

DEFAULT_BOUNDARIES_S = (3.0, 5.0, 8.0, 12.0, 16.0)
DEFAULT_MAX_BATCH_DURATION_S = 90.0
DEFAULT_TEMPERATURE = 0.3
MIN_WEIGHT = 1e-12


def durations_to_ms(durations_s: np.ndarray) -> np.ndarray:
    """Seconds to integer milliseconds, rounded half up (the time rule of docs/bridge-tuples.md)."""
    return np.floor(np.asarray(durations_s, dtype=np.float64) * 1000.0 + 0.5).astype(np.int64)


def language_sample_weights(language_codes: np.ndarray, temperature: float) -> np.ndarray:
    """Per-utterance weight ``target_share / actual_share`` of its language (seed §5.2)."""
    counts = np.bincount(language_codes).astype(np.float64)
    present = counts > 0
    if temperature <= 0:
        language_weight = np.where(present, 1.0, 0.0)
    else:
        language_weight = np.where(present, np.power(counts, temperature), 0.0)
    target = language_weight / language_weight.sum()
    actual = counts / language_codes.shape[0]
    per_language = np.divide(target, actual, out=np.zeros_like(target), where=present)
    return per_language[language_codes]


def weighted_bucket_order(bucket_ids: np.ndarray, weights: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Utterance indices grouped by bucket (ascending id) and, inside a bucket, by ``U ** (1/w)``
    descending, ties to the larger index."""
    keys = np.power(uniforms, 1.0 / np.maximum(weights, MIN_WEIGHT))
    by_bucket = np.argsort(bucket_ids, kind="stable")  # radix sort on small ints
    sizes = np.bincount(bucket_ids) if bucket_ids.shape[0] else np.zeros(0, np.int64)
    parts, start = [], 0
    for size in sizes.tolist():
        # Indices descending, then a stable sort by key descending: equal keys stay larger-index first.
        members = by_bucket[start : start + size][::-1]
        parts.append(members[_argsort_descending_ties_by_position(keys[members])])
        start += size
    return np.concatenate(parts) if parts else by_bucket


def _argsort_descending_ties_by_position(values: np.ndarray) -> np.ndarray:
    """Stable descending argsort. Introsort is faster than numpy's stable float sort, and exact
    ties are rare (equal uniforms, or keys that underflow to 0), so fix them only when present."""
    order = np.argsort(-values, kind="quicksort")
    ordered = values[order]
    if ordered.shape[0] > 1 and np.any(ordered[1:] == ordered[:-1]):
        return np.argsort(-values, kind="stable")
    return order


def pack_greedy(durations_ms: np.ndarray, segment_ends: np.ndarray, cap_ms: int) -> np.ndarray:
    """Start offsets of greedy batches over ``durations_ms`` (already in packing order).

    ``segment_ends`` are the exclusive ends of the buckets' runs; no batch crosses one. Returns the
    batch starts followed by ``len(durations_ms)`` (CSR offsets).
    """
    n = durations_ms.shape[0]
    if n == 0:
        return np.zeros(1, np.int64)
    prefix = np.concatenate([[0], np.cumsum(durations_ms)])
    # For every possible start s: the first index the batch starting at s cannot take.
    stop = np.searchsorted(prefix, prefix[:-1] + cap_ms, side="right") - 1
    run_sizes = np.diff(np.concatenate([[0], segment_ends]))
    run_end = np.repeat(segment_ends, run_sizes)
    following = np.minimum(np.maximum(stop, np.arange(n) + 1), run_end)
    # One step per batch, not per utterance; a memoryview hands out Python ints without converting
    # the whole array (tolist) or boxing numpy scalars.
    following = memoryview(np.ascontiguousarray(following, dtype=np.int64))
    starts = []
    start = 0
    while start < n:
        starts.append(start)
        start = following[start]
    starts.append(n)
    return np.array(starts, np.int64)


class DurationBucketBatchSampler:
    """A ``batch_sampler`` for ``torch.utils.data.DataLoader``: yields lists of dataset indices.

    ``durations_s`` and ``languages`` describe the dataset (one entry per index). Call
    :meth:`set_epoch` at the start of each epoch (Lightning and ``DistributedSampler`` users do);
    ``len()`` is the number of batches this rank yields in the current epoch.
    """

    def __init__(
        self,
        durations_s: Sequence[float] | np.ndarray,
        languages: Sequence[str] | np.ndarray,
        *,
        boundaries_s: Sequence[float] = DEFAULT_BOUNDARIES_S,
        max_batch_duration_s: float = DEFAULT_MAX_BATCH_DURATION_S,
        temperature: float = DEFAULT_TEMPERATURE,
        world_size: int = 1,
        rank: int = 0,
        grad_accum: int = 1,
        seed: int = 0,
        epoch: int = 0,
        epoch_fraction: float = 1.0,
    ):
        durations = np.asarray(durations_s, dtype=np.float64)
        if durations.ndim != 1 or len(languages) != durations.shape[0]:
            raise ValueError("durations_s and languages must be 1-D and of the same length")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} must be in [0, world_size={world_size})")
        if grad_accum < 1 or max_batch_duration_s <= 0 or not 0 < epoch_fraction <= 1:
            raise ValueError("grad_accum >= 1, max_batch_duration_s > 0 and 0 < epoch_fraction <= 1 are required")
        self.durations_ms = durations_to_ms(durations)
        names = np.asarray(languages)
        if names.dtype == object:  # pyarrow/pandas hand over object arrays; unique needs one dtype
            names = names.astype(str)
        self.language_names, self.language_codes = np.unique(names, return_inverse=True)
        self.bucket_ids = np.searchsorted(np.asarray(boundaries_s, np.float64), durations, side="right")
        self.cap_ms = int(durations_to_ms(np.array([max_batch_duration_s]))[0])
        self.temperature = float(temperature)
        self.world_size, self.rank, self.grad_accum = int(world_size), int(rank), int(grad_accum)
        self.seed, self.epoch_fraction = int(seed), float(epoch_fraction)
        self.weights = (
            language_sample_weights(self.language_codes, self.temperature) if durations.shape[0] else np.zeros(0)
        )
        self._prepare_buckets()
        self.set_epoch(epoch)

    def _prepare_buckets(self) -> None:
        """What every epoch shares: bucket membership, its order, sizes and each utterance's exponent."""
        n = self.durations_ms.shape[0]
        # Bucket ids renumbered by first appearance, so batches concatenate in the original ASR
        # pipeline's dict order.
        present, first_seen = np.unique(self.bucket_ids, return_index=True)
        appearance_rank = np.empty(present.shape[0], np.int64)
        appearance_rank[np.argsort(first_seen, kind="stable")] = np.arange(present.shape[0])
        bucket_order = appearance_rank[np.searchsorted(present, self.bucket_ids)] if n else self.bucket_ids
        self._bucket_sizes = np.bincount(bucket_order, minlength=present.shape[0]) if n else np.zeros(0, np.int64)
        by_bucket = np.argsort(bucket_order, kind="stable")  # radix sort on small ints
        # Each bucket's members by index descending (see weighted_bucket_order), concatenated.
        self._members, start = [], 0
        for size in self._bucket_sizes.tolist():
            self._members.append(by_bucket[start : start + size][::-1].copy())
            start += size
        exponents = 1.0 / np.maximum(self.weights, MIN_WEIGHT)
        self._member_exponents = [exponents[m] for m in self._members]

    def set_epoch(self, epoch: int) -> None:
        """Rebuild the batches for ``epoch`` (a different shuffle for every ``seed + epoch``)."""
        self.epoch = int(epoch)
        self._flat, self._offsets = self._build_rank_batches()

    def _build_rank_batches(self) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(self.seed + self.epoch)
        n = self.durations_ms.shape[0]
        uniforms = rng.random(n)
        parts = [
            m[_argsort_descending_ties_by_position(np.power(uniforms[m], e))]
            for m, e in zip(self._members, self._member_exponents, strict=True)
        ]
        order = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        bucket_sizes = self._bucket_sizes
        if self.epoch_fraction < 1.0:
            order, bucket_sizes = _keep_prefix_of_each_bucket(order, bucket_sizes, self.epoch_fraction)
        ordered_ms = self.durations_ms[order]
        offsets = pack_greedy(ordered_ms, np.cumsum(bucket_sizes), self.cap_ms)
        lengths = np.diff(offsets)
        longest = np.maximum.reduceat(ordered_ms, offsets[:-1]) if lengths.shape[0] else np.zeros(0, np.int64)
        by_cost = np.argsort(-(lengths * longest), kind="stable")
        usable = (by_cost.shape[0] // self.world_size) * self.world_size
        mine = by_cost[self.rank : usable : self.world_size]
        mine = mine[: mine.shape[0] - mine.shape[0] % self.grad_accum]
        mine = mine[rng.permutation(mine.shape[0])]
        my_lengths = lengths[mine]
        starts = offsets[:-1][mine]
        my_offsets = np.concatenate([[0], np.cumsum(my_lengths)]).astype(np.int64)
        # Gather every chosen batch's indices in one shot: position p belongs to batch b.
        within = np.arange(my_offsets[-1]) - np.repeat(my_offsets[:-1], my_lengths)
        flat = order[np.repeat(starts, my_lengths) + within]
        return flat.astype(np.int64), my_offsets

    def __len__(self) -> int:
        return self._offsets.shape[0] - 1

    def __iter__(self) -> Iterator[list[int]]:
        flat, offsets = self._flat, self._offsets
        for b in range(len(self)):
            yield flat[offsets[b] : offsets[b + 1]].tolist()

    def batches(self) -> list[np.ndarray]:
        """This rank's batches for the current epoch, as index arrays (for inspection and tests)."""
        return np.split(self._flat, self._offsets[1:-1]) if len(self) else []


def _keep_prefix_of_each_bucket(
    order: np.ndarray, bucket_sizes: np.ndarray, fraction: float
) -> tuple[np.ndarray, np.ndarray]:
    """The first ``ceil(fraction * size)`` utterances of each bucket's weighted ordering."""
    kept_sizes = np.ceil(bucket_sizes * fraction).astype(np.int64)
    bucket_starts = np.concatenate([[0], np.cumsum(bucket_sizes)[:-1]])
    position_in_bucket = np.arange(order.shape[0]) - np.repeat(bucket_starts, bucket_sizes)
    keep = position_in_bucket < np.repeat(kept_sizes, bucket_sizes)
    return order[keep], kept_sizes
