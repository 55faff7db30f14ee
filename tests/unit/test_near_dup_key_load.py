"""What the fixed per-key cap keeps out of a shard's audio vote: counted per key on a hand-built
index, reported by the stage (from the capped segments on disk, as from the utterances in memory),
and warned about in the run's log once a lowered cap silences the shard's keys."""

from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest

from speechdata.quality import near_dup_matching, near_duplicates
from speechdata.quality.fingerprint_audio import AudioFingerprint
from speechdata.quality.near_dup_candidates import AudioKeyLoad
from speechdata.quality.near_dup_matching import MemorySource, NearDuplicateThresholds, UtteranceSignals, decide_shard
from speechdata.quality.near_dup_postings import AUDIO_KEY_SAMPLING, _mix


def sampled_values(count: int, seed: int = 0) -> list[int]:
    """Sub-fingerprint values the index samples as keys (one value in two is)."""
    values = np.random.default_rng(seed).integers(1, 2**32, 16 * count, dtype=np.uint64)
    return values[_mix(values) % np.uint64(AUDIO_KEY_SAMPLING) == 0][:count].astype(np.uint32).tolist()


A, B, C, D, *FILLER = sampled_values(40)


def utterance(shard_id: str, number: int, values: list[int]) -> UtteranceSignals:
    fingerprint = AudioFingerprint(np.array(values, np.uint32), np.ones(len(values), bool))
    digest = f"{shard_id}-{number}".encode().hex().ljust(64, "0")
    return UtteranceSignals(shard_id, f"{shard_id}-{number:03d}", digest, fingerprint, None, 0)


def earlier_shard() -> list[UtteranceSignals]:
    """Value A held by five utterances, B by one."""
    return [utterance("early", n, [A, FILLER[n]] + ([B] if n == 0 else [])) for n in range(5)]


def new_shard(shard_id: str = "new") -> list[UtteranceSignals]:
    """0: A (past a cap of 3), B (one earlier posting: it votes), C (none). 1: A (now 6 earlier,
    with 0's) and D (none): every key that met a posting is past the cap. 2: C (0's): it votes."""
    return [utterance(shard_id, 0, [A, B, C]), utterance(shard_id, 1, [A, D]), utterance(shard_id, 2, [C])]


def decided_load(earlier, new) -> AudioKeyLoad:
    source = MemorySource([(s, (s.shard_id, s.utt_id)) for s in earlier])
    load = AudioKeyLoad()
    decide_shard(source.next_position, new, source, NearDuplicateThresholds(), key_load=load)
    return load


def test_keys_past_the_cap_and_utterances_left_without_a_voting_key_are_counted_per_key():
    with mock.patch.object(near_dup_matching, "MAX_KEY_OCCURRENCES", 3):
        load = decided_load(earlier_shard(), new_shard())

    assert load == AudioKeyLoad(utterances=3, keys=6, keys_met=4, keys_past_cap=2, utterances_silenced=1)
    assert load.share_past_cap == pytest.approx(2 / 6)


def test_at_the_stages_cap_no_key_of_a_small_index_is_past_it_and_a_lower_cap_moves_the_figure():
    shares = {}
    for cap in (near_dup_matching.MAX_KEY_OCCURRENCES, 5, 1, 0):
        with mock.patch.object(near_dup_matching, "MAX_KEY_OCCURRENCES", cap):
            shares[cap] = decided_load(earlier_shard(), new_shard()).share_past_cap

    # A holds 5 then 6 earlier postings, B 1, C 0 then 1: only a cap under them leaves them out
    assert shares == {near_dup_matching.MAX_KEY_OCCURRENCES: 0.0, 5: 1 / 6, 1: 2 / 6, 0: 4 / 6}


def test_the_stage_reports_the_load_from_its_capped_segments_and_warns_once_past_the_threshold(data_root, monkeypatch):
    shards = {"early": earlier_shard(), "new": new_shard(), "later": new_shard("later")}
    monkeypatch.setattr(near_duplicates, "shard_signals", lambda root, shard_id: (shards[shard_id], [], 1.0))

    early = near_duplicates.run_near_duplicates(data_root, "early")
    new = near_duplicates.run_near_duplicates(data_root, "new")
    assert early.audio_key_load.keys_met == 4  # A, met by four of its own shard's five
    assert new.audio_key_load.keys_past_cap == 0 and new.recall_warning() is None

    monkeypatch.setattr(near_dup_matching, "MAX_KEY_OCCURRENCES", 3)
    later = near_duplicates.run_near_duplicates(data_root, "later")

    # Read through the index's segments (capped at 4 postings a key), counted as in memory
    assert later.audio_key_load == decided_load(shards["early"] + shards["new"], shards["later"])
    assert later.audio_key_load.share_past_cap > near_duplicates.KEYS_PAST_CAP_WARNING_SHARE
    warning = later.recall_warning()
    assert warning is not None and "MAX_KEY_OCCURRENCES (3)" in warning
    assert "Near duplicates past N hours" in warning and "later:" in warning


def test_the_asset_logs_the_warning_and_records_the_load_in_its_metadata(data_root, monkeypatch):
    from assets.near_duplicates import _near_duplicates_result

    shards = {"early": earlier_shard(), "new": new_shard()}
    monkeypatch.setattr(near_duplicates, "shard_signals", lambda root, shard_id: (shards[shard_id], [], 1.0))
    near_duplicates.run_near_duplicates(data_root, "early")
    monkeypatch.setattr(near_dup_matching, "MAX_KEY_OCCURRENCES", 0)
    summary = near_duplicates.run_near_duplicates(data_root, "new")
    log = mock.Mock()

    metadata = _near_duplicates_result(SimpleNamespace(log=log), summary).metadata

    assert metadata["audio_keys_looked_up"] == 6 and metadata["audio_keys_past_cap"] == 4
    assert metadata["audio_keys_past_cap_share"] == round(4 / 6, 6)
    assert metadata["utterances_no_audio_key_voting"] == 3
    [warned] = [call.args[0] for call in log.warning.call_args_list]
    assert warned == summary.recall_warning()
