"""The original ASR training script's sampler in plain Python: readable, slow, the oracle for the numpy one.

It follows that script's code line by line, with two changes that the numpy sampler documents and that
make an exact comparison possible: the random numbers come from ``np.random.default_rng(seed + epoch)``
(``U`` for utterance ``i`` is the ``i``-th of ``rng.random(n)``, then ``rng.permutation`` for the
rank-local shuffle), and durations are added in integer milliseconds. The benchmark times it too.
"""

import bisect
import math
from collections import defaultdict

import numpy as np


def reference_rank_batches(
    durations_s,
    languages,
    *,
    boundaries_s=(3.0, 5.0, 8.0, 12.0, 16.0),
    max_batch_duration_s=90.0,
    temperature=0.3,
    world_size=1,
    rank=0,
    grad_accum=1,
    seed=0,
    epoch=0,
):
    rng = np.random.default_rng(seed + epoch)
    uniforms = rng.random(len(durations_s)).tolist()
    durations_ms = [math.floor(d * 1000.0 + 0.5) for d in durations_s]
    cap_ms = math.floor(max_batch_duration_s * 1000.0 + 0.5)

    buckets = defaultdict(list)
    for i, duration in enumerate(durations_s):
        buckets[bisect.bisect_right(list(boundaries_s), duration)].append(i)

    lang_counts = defaultdict(int)
    for lang in languages:
        lang_counts[lang] += 1
    total = len(durations_s)
    if temperature <= 0:
        lang_w = {lang: 1.0 for lang in lang_counts}
    else:
        lang_w = {lang: c**temperature for lang, c in lang_counts.items()}
    ws = sum(lang_w.values())
    lang_props = {lang: w / ws for lang, w in lang_w.items()}
    sample_weights = []
    for lang in languages:
        actual = lang_counts[lang] / total
        sample_weights.append(lang_props[lang] / actual if actual > 0 else 0)

    all_batches = []
    for indices in buckets.values():
        keyed = [(uniforms[i] ** (1.0 / max(sample_weights[i], 1e-12)), i) for i in indices]
        keyed.sort(reverse=True)
        batch, batch_ms = [], 0
        for _, idx in keyed:
            d = durations_ms[idx]
            if batch_ms + d > cap_ms and batch:
                all_batches.append(batch)
                batch, batch_ms = [], 0
            batch.append(idx)
            batch_ms += d
        if batch:
            all_batches.append(batch)

    all_batches.sort(key=lambda b: len(b) * max(durations_ms[i] for i in b), reverse=True)
    usable = (len(all_batches) // world_size) * world_size
    rank_batches = all_batches[rank:usable:world_size]
    if grad_accum > 1:
        rank_batches = rank_batches[: len(rank_batches) - len(rank_batches) % grad_accum]
    permutation = rng.permutation(len(rank_batches)).tolist()
    return [rank_batches[p] for p in permutation]
