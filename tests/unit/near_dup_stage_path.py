"""What the near-duplicate index's stage-path tests share: the cap lowered to 4 with the merge and
fold settings that make a few shards merge and fold, corpora of pooled keys that pass the cap in some
segments and not in others, the stage's path for one shard (reserve, prefetch, settle, decide,
commit, write, repair and decide again, compact), and what the tests read back from the index."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from speechdata.io import layout
from speechdata.quality import near_dup_index_merge, near_dup_index_reader, near_dup_matching, near_dup_postings
from speechdata.quality import near_dup_order_fold as order_fold
from speechdata.quality.fingerprint_audio import AudioFingerprint
from speechdata.quality.near_dup_index import (
    IndexDamaged,
    IndexReader,
    commit_shard_entries,
    compact_index,
    index_keys,
    repair_index,
    reserve_position,
    wait_for_earlier,
)
from speechdata.quality.near_dup_matching import NearDuplicateThresholds, UtteranceSignals, decide_shard
from speechdata.quality.near_dup_postings import audio_only_keys, read_all_postings, sort_postings
from speechdata.quality.near_duplicates import write_near_duplicate_files
from speechdata.quality.paths import near_duplicate_flags

CAP = 4
"""``MAX_KEY_OCCURRENCES`` 3: a key with 4 earlier postings never votes."""


def lower_cap_and_fanout(monkeypatch, *, fold: bool = True) -> None:
    """The cap at ``CAP``, merges of 3 segments and (``fold``) a shard list that folds every 4
    shards into parts of 4 rows: what a few shards of a test reach."""
    monkeypatch.setattr(near_dup_matching, "MAX_KEY_OCCURRENCES", CAP - 1)
    monkeypatch.setattr(near_dup_index_merge, "FANOUT", 3)
    if fold:
        monkeypatch.setattr(order_fold, "FOLD_EVERY", 4)  # the shard list folds while shards decide
        monkeypatch.setattr(order_fold, "PART_ROWS", 4)


def uncapped(monkeypatch) -> None:
    """Segments written as before the cap (every posting kept), read as before it: every key in
    every live segment (the capped index's reader stops reading a key past the cap)."""
    monkeypatch.setattr(near_dup_postings, "cap_postings", lambda postings: postings)
    monkeypatch.setattr(near_dup_postings.SegmentWriter, "_capped", lambda self, postings: postings)
    monkeypatch.setattr(near_dup_index_reader, "SKIP_CAPPED_KEYS", False)


def sampled_pool(rng, size: int) -> np.ndarray:
    values = rng.integers(1, 2**32, 8 * size, dtype=np.uint64)
    chosen = near_dup_postings._mix(values) % np.uint64(near_dup_postings.AUDIO_KEY_SAMPLING) == 0
    return values[chosen][:size].astype(np.uint32)


def speech_like(shard_id: str, count: int, rng, pool: np.ndarray, originals=()) -> list[UtteranceSignals]:
    """Utterances whose sub-fingerprints come from ``pool`` one frame in four (common keys) and are
    random otherwise; the first ones near copies of ``originals`` (a few bits flipped in a tenth of
    the frames, another exact hash)."""
    made = []
    for number in range(count):
        if number < len(originals):
            values = originals[number].fingerprint.sub_fingerprints.copy()
            flipped = rng.random(len(values)) < 0.1
            values[flipped] ^= np.uint32(0b1011)
        else:
            values = rng.integers(0, 2**32, int(rng.integers(60, 90)), dtype=np.uint32)
            common = rng.random(len(values)) < 0.25
            values[common] = rng.choice(pool, int(common.sum()))
        fingerprint = AudioFingerprint(values, np.ones(len(values), bool))
        made.append(UtteranceSignals(shard_id, f"{shard_id}-{number:03d}", rng.bytes(32).hex(), fingerprint, None, 0))
    return made


def corpus_of(seed: int, shards: int) -> list[list[UtteranceSignals]]:
    rng = np.random.default_rng(seed)
    pool = sampled_pool(rng, 24)
    corpus = []
    for number in range(shards):
        earlier = [s for shard in corpus for s in shard]
        originals = [earlier[i] for i in rng.choice(len(earlier), 2, replace=False)] if earlier else []
        corpus.append(speech_like(f"s{number:03d}", 4, rng, pool, originals))
    return corpus


def outputs(data_root, shard_id: str) -> tuple[bytes, bytes]:
    return tuple(
        data_root.fs.cat_file(data_root.path(relative))
        for relative in (layout.near_duplicates(shard_id), near_duplicate_flags(shard_id))
    )


Decide = Callable[..., list]
"""``decide(data_root, reservation, signals, reader, own, budget)``: the shard's decisions, or
:class:`IndexDamaged` raised where the index is found damaged."""


def decide_as_the_stage(data_root, reservation, signals, reader, own, budget) -> list:
    if budget is None:
        return decide_shard(reservation.position, signals, reader, NearDuplicateThresholds(), own_postings=own)
    return decide_shard(
        reservation.position, signals, reader, NearDuplicateThresholds(), own_postings=own, budget=budget
    )


def run_shard(
    data_root,
    signals,
    *,
    meanwhile: Callable | None = None,
    budget: int | None = None,
    decide: Decide = decide_as_the_stage,
    returning: tuple[str, ...] = ("files", "repairs"),
) -> tuple:
    """The stage's path for one shard: prefetch the postings of its keys (reading stopped past
    ``budget`` postings), settle, decide against the index, commit, write its files, merge what is
    due; repair and decide again where the index is found damaged. ``meanwhile(data_root)``: what
    happens between the prefetch and the settled read (once). Returns the items ``returning`` names,
    in its order: ``decisions``; ``files`` (the shard's written files, only written when asked for);
    ``counts`` (the earlier postings of each of the shard's keys counted up to the cap, read before
    the commit, while the segments the reader saw are still there); ``repairs``."""
    repairs = []
    shard_id = signals[0].shard_id
    for _ in range(2):
        try:
            with reserve_position(data_root, shard_id) as reservation:
                own = index_keys(signals, reservation.position)
                reader = IndexReader(data_root, reservation.position)
                reader.prefetch(own["key"], audio_only_keys(own), limit=budget)
                if meanwhile is not None:
                    meanwhile(data_root)
                    meanwhile = None
                reader.settle(wait_for_earlier(data_root, reservation))
                decisions = decide(data_root, reservation, signals, reader, own, budget)
                counts = capped_counts(reader, signals) if "counts" in returning else None
                commit_shard_entries(data_root, reservation, signals, decisions, postings=own)
                if "files" in returning:
                    write_near_duplicate_files(data_root, shard_id, decisions)
            break
        except IndexDamaged:
            repairs += repair_index(data_root)
    while compact_index(data_root):
        pass
    found = {"decisions": decisions, "counts": counts, "repairs": repairs}
    if "files" in returning:
        found["files"] = outputs(data_root, shard_id)
    return tuple(found[name] for name in returning)


def capped_counts(reader: IndexReader, signals) -> np.ndarray:
    """Per key of the shard: the earlier postings the reader gives (every key looked up in every
    segment: no ``audio_only``), counted up to the cap."""
    keys = np.unique(index_keys(signals, reader.position)["key"])
    postings = sort_postings(reader.postings(keys))
    counts = np.searchsorted(postings["key"], keys, "right") - np.searchsorted(postings["key"], keys, "left")
    return np.minimum(counts, CAP)


def segment_postings(data_root) -> dict[str, np.ndarray]:
    found = {}
    for path in sorted(data_root.glob(f"{layout.NEAR_DUPLICATES_INDEX}/segments/*.seg")):
        with data_root.fs.open(path, "rb") as handle:
            found[path.rsplit("/", 1)[-1]] = read_all_postings(handle, path)[1]
    return found


def segment_names(data_root) -> set[str]:
    return {path.rsplit("/", 1)[-1] for path in data_root.glob(f"{layout.NEAR_DUPLICATES_INDEX}/segments/*.seg")}


class LookupLog:
    """Every segment lookup: the segment and the keys looked up in it."""

    def __init__(self, monkeypatch):
        self.lookups: list[tuple[str, np.ndarray]] = []
        lookup = near_dup_index_reader.lookup_segment

        def logged(handle, path, keys):
            self.lookups.append((path.rsplit("/", 1)[-1], keys.copy()))
            return lookup(handle, path, keys)

        monkeypatch.setattr(near_dup_index_reader, "lookup_segment", logged)

    def segments_looking_up(self, key) -> list[str]:
        return [name for name, keys in self.lookups if key in keys]

    @property
    def keys_looked_up(self) -> int:
        return sum(len(keys) for _, keys in self.lookups)


def decided_again_reading_every_key(tmp_path, data_root, signals, monkeypatch) -> tuple[bytes, bytes]:
    """The files a committed shard's decisions make when a reader made now, at its position, reads
    every key in every live segment (main's reader)."""
    from speechdata.io.storage import DataRoot

    monkeypatch.setattr(near_dup_index_reader, "SKIP_CAPPED_KEYS", False)
    shard_id = signals[0].shard_id
    with reserve_position(data_root, shard_id) as again:  # committed: its position again
        reader = IndexReader(data_root, again.position, wait_for_earlier(data_root, again))
        decisions = decide_shard(again.position, signals, reader, NearDuplicateThresholds())
    scratch = DataRoot(str(tmp_path / f"again-{shard_id}"))
    write_near_duplicate_files(scratch, shard_id, decisions)
    return outputs(scratch, shard_id)


def decide_and_commit(data_root, reservation, signals) -> list:
    """An earlier shard's run while a later one waits on it: decided against the settled index at
    its reserved position and committed (its files not written). Returns its decisions."""
    reader = IndexReader(data_root, reservation.position, wait_for_earlier(data_root, reservation))
    decisions = decide_shard(reservation.position, signals, reader, NearDuplicateThresholds())
    commit_shard_entries(data_root, reservation, signals, decisions)
    return decisions
