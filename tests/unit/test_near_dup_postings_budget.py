"""A shard whose earlier postings pass ``SPEECHDATA_NEAR_DUP_POSTINGS_BUDGET_MB`` gathers its
candidates in chunks of utterances that fit it, and decides byte for byte as one lookup of every key
does: with a budget of a few postings (many chunks, the prefetch stopped), on a capped index of
pooled keys (the cap lowered to 4) across merges, a fold of the shard list, a shard committed and
merged between a prefetch and its settled read, and a shard re-indexed after its capped postings
were merged (the repair found in the chunked read as in the whole one); the in-memory source and
the batch pass likewise; the setting read and refused."""

import numpy as np
import pytest

from speechdata.io.storage import DataRoot
from speechdata.quality import near_dup_matching
from speechdata.quality.near_dup_candidates import AudioKeyLoad
from speechdata.quality.near_dup_index import (
    IndexDamaged,
    IndexReader,
    compact_index,
    index_keys,
    reserve_position,
    wait_for_earlier,
)
from speechdata.quality.near_dup_matching import (
    POSTINGS_BUDGET_ENV,
    MemorySource,
    NearDuplicateThresholds,
    decide_shard,
    postings_budget,
)
from speechdata.quality.near_dup_postings import POSTING_DTYPE, audio_only_keys
from speechdata.quality.near_duplicates import write_near_duplicate_files
from tests.unit.near_dup_stage_path import (
    corpus_of,
    decide_and_commit,
    lower_cap_and_fanout,
    outputs,
    run_shard,
    sampled_pool,
    speech_like,
)

TINY_BUDGET_MB = "0.0005"
"""18 postings: every shard's earlier postings pass it, most chunks of two utterances do."""


@pytest.fixture(autouse=True)
def small_cap_fanout_and_parts(monkeypatch):
    lower_cap_and_fanout(monkeypatch)


class Lookups:
    """The reader's lookups: how many were refused for passing their limit."""

    def __init__(self, monkeypatch):
        self.refused = self.answered = 0
        postings = IndexReader.postings

        def counted(reader, keys, audio_only=None, limit=None):
            found = postings(reader, keys, audio_only, limit)
            if found is None:
                self.refused += 1
            else:
                self.answered += 1
            return found

        monkeypatch.setattr(IndexReader, "postings", counted)


def decided(data_root, position, signals, reader, budget) -> tuple[str, object]:
    """``("decided", (decisions, key load))`` or ``("damaged", message)``."""
    load = AudioKeyLoad()
    try:
        found = decide_shard(
            position, signals, reader, NearDuplicateThresholds(), own_postings=index_keys(signals, position),
            key_load=load, budget=budget,
        )  # fmt: skip
    except IndexDamaged as damaged:
        return "damaged", str(damaged)
    return "decided", (found, load)


def run_shard_checked(tmp_path, data_root, signals, meanwhile=None) -> list[str]:
    """The stage's path for one shard under the budget the setting gives (prefetch stopped past it,
    settle, decide chunk by chunk, commit, merge what is due), each decision checked against a reader
    of the same settled state reading every key at once, written files compared byte for byte."""
    shard_id = signals[0].shard_id
    whole_files = []

    def chunked_as_whole(data_root, reservation, signals, reader, own, budget):
        chunked = decided(data_root, reservation.position, signals, reader, budget)
        whole_reader = IndexReader(data_root, reservation.position, wait_for_earlier(data_root, reservation))
        whole = decided(data_root, reservation.position, signals, whole_reader, None)
        assert chunked[0] == whole[0]
        if chunked[0] == "damaged":
            raise IndexDamaged(chunked[1])
        (decisions, load), (whole_decisions, whole_load) = chunked[1], whole[1]
        assert decisions == whole_decisions and load == whole_load
        assert reader.utterances == whole_reader.utterances
        scratch = DataRoot(str(tmp_path / f"whole-{shard_id}-{len(whole_files)}"))
        write_near_duplicate_files(scratch, shard_id, whole_decisions)
        whole_files.append(outputs(scratch, shard_id))
        return decisions

    written, repairs = run_shard(
        data_root, signals, meanwhile=meanwhile, budget=postings_budget(), decide=chunked_as_whole
    )
    assert written == whole_files[-1]
    return repairs


def test_a_shard_past_the_budget_decides_in_chunks_as_in_one_lookup(tmp_path, monkeypatch):
    monkeypatch.setenv(POSTINGS_BUDGET_ENV, TINY_BUDGET_MB)
    lookups = Lookups(monkeypatch)
    rng = np.random.default_rng(99)
    corpus = corpus_of(11, 7)
    hum = sampled_pool(rng, 1)[0]
    for number in (0, 1):  # s000 holds the key 4 times (the cap), s001 twice more
        for rank in range(4 if number == 0 else 2):
            corpus[number][rank].fingerprint.sub_fingerprints[10] = hum
    corpus.append(speech_like("s007", 4, rng, sampled_pool(rng, 24), originals=[corpus[1][0]]))
    corpus[7][0].fingerprint.sub_fingerprints[10] = hum
    replaced = speech_like("s000", 4, np.random.default_rng(12), sampled_pool(rng, 24))  # without it
    data_root = DataRoot(str(tmp_path / "index"))
    repairs = []
    for number, shard in enumerate(corpus):
        repairs += run_shard_checked(tmp_path, data_root, shard)
        if number == 3:  # after its capped postings were merged
            repairs += run_shard_checked(tmp_path, data_root, replaced)
    assert any("segment rebuilt from its entries" in line for line in repairs)
    # b is reserved after a, prefetches, then a commits and merges before b's settled read.
    late_a = speech_like("a", 4, rng, sampled_pool(rng, 24), originals=corpus[3][:2])
    late_b = speech_like("b", 4, rng, sampled_pool(rng, 24), originals=late_a[2:])
    with reserve_position(data_root, "a") as first:

        def a_commits(root):
            decide_and_commit(root, first, late_a)
            assert compact_index(root)

        repairs += run_shard_checked(tmp_path, data_root, late_b, meanwhile=a_commits)
    assert lookups.refused >= len(corpus) and lookups.answered > 2 * lookups.refused  # chunks, many
    assert sum(d.kind is not None for d in decide_again(data_root, late_b)) == 2  # the copies of a's


def decide_again(data_root, signals):
    with reserve_position(data_root, signals[0].shard_id) as again:
        reader = IndexReader(data_root, again.position, wait_for_earlier(data_root, again))
        return decide_shard(again.position, signals, reader, NearDuplicateThresholds(), budget=1)


def test_a_prefetch_past_its_limit_keeps_nothing_and_the_settled_read_is_refused_at_once(tmp_path):
    data_root = DataRoot(str(tmp_path / "index"))
    *corpus, new = corpus_of(5, 4)
    for shard in corpus:
        run_shard_checked(tmp_path, data_root, shard)
    with reserve_position(data_root, "s003") as reservation:
        own = index_keys(new, reservation.position)
        whole = IndexReader(data_root, reservation.position, wait_for_earlier(data_root, reservation))
        everything = whole.postings(own["key"], audio_only_keys(own))
        assert len(everything) > 10
        reader = IndexReader(data_root, reservation.position)
        reader.prefetch(own["key"], audio_only_keys(own), limit=len(everything) - 1)
        assert reader._read == {} and reader.postings_read > 0
        read = reader.postings_read
        reader.settle(wait_for_earlier(data_root, reservation))
        assert reader.postings(own["key"], audio_only_keys(own), limit=len(everything) - 1) is None
        assert reader.postings_read == read  # refused without reading
        again = reader.postings(own["key"], audio_only_keys(own), limit=whole.postings_read)
        assert np.array_equal(np.sort(again, order=["key", "owner", "frame"]), np.sort(everything))


def test_the_in_memory_source_decides_in_chunks_as_in_one_lookup():
    corpus = corpus_of(7, 6)
    indexed = [(s, (s.shard_id, s.utt_id)) for shard in corpus[:5] for s in shard]
    source = MemorySource(indexed)
    whole, chunked = AudioKeyLoad(), AudioKeyLoad()
    decisions = decide_shard(
        source.next_position, corpus[5], source, NearDuplicateThresholds(), key_load=whole, budget=None
    )
    assert (
        decide_shard(source.next_position, corpus[5], source, NearDuplicateThresholds(), key_load=chunked, budget=3)
        == decisions
    )
    assert whole == chunked and whole.keys_past_cap > 0
    assert sum(d.kind is not None for d in decisions) == 2


@pytest.mark.parametrize(
    ("value", "expected"),
    [("", 256 * 2**20 // POSTING_DTYPE.itemsize), (" 0 ", None), ("0.5", 2**19 // POSTING_DTYPE.itemsize), ("1e-9", 1)],
)
def test_the_budget_setting_reads_mib_of_postings(monkeypatch, value, expected):
    monkeypatch.setenv(POSTINGS_BUDGET_ENV, value)
    assert postings_budget() == expected


@pytest.mark.parametrize("value", ["-1", "lots", "nan", "inf", "١٢"])
def test_a_bad_budget_is_refused_naming_the_setting(monkeypatch, value):
    monkeypatch.setenv(POSTINGS_BUDGET_ENV, value)
    with pytest.raises(ValueError, match=POSTINGS_BUDGET_ENV):
        postings_budget()


def test_a_shards_run_refuses_a_bad_budget_before_any_work(tmp_path, monkeypatch):
    from speechdata.quality.near_duplicates import run_near_duplicates

    monkeypatch.setenv(POSTINGS_BUDGET_ENV, "half")
    with pytest.raises(ValueError, match=POSTINGS_BUDGET_ENV):  # not the missing shard's error
        run_near_duplicates(DataRoot(str(tmp_path)), "no-such-shard")
    assert list(tmp_path.iterdir()) == []


def test_the_batch_pass_decides_in_chunks_as_in_one_lookup(monkeypatch):
    from tests.unit.test_near_dup_batch import batch, synthetic_corpus

    monkeypatch.setattr(near_dup_matching, "MAX_KEY_OCCURRENCES", 500)  # the stage's: the corpus is built for it
    corpus, _ = synthetic_corpus(seed=2)
    thresholds = NearDuplicateThresholds()
    ids = [shard[0].shard_id for shard in corpus]
    whole = batch(corpus, thresholds, ids)
    refused = []
    within = near_dup_matching.within

    def counted(postings, limit):
        found = within(postings, limit)
        refused.append(found is None)
        return found

    monkeypatch.setattr("speechdata.quality.near_dup_batch.within", counted)
    monkeypatch.setenv(POSTINGS_BUDGET_ENV, TINY_BUDGET_MB)
    assert batch(corpus, thresholds, ids) == whole
    assert sum(refused) >= len(corpus) - 1 and len(refused) > 2 * sum(refused)
    assert sum(d.kind is not None for shard in whole.values() for d in shard) > 0
