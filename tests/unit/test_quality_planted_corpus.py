"""The default tiny-profile policy rejects every planted defect with its own reason and no clean utterance."""

import duckdb
import pytest

from speechdata.landing.ingest import run_normalized_audio, run_raw_shards
from speechdata.quality.decisions import excluded_utterances
from speechdata.quality.paths import quality_decisions, quality_signals
from speechdata.quality.policy import default_policies
from speechdata.quality.stage import run_quality_decisions, run_quality_signals
from speechdata.vad.silero import load_silero_model
from tests.quality_corpus import PLANTED_REASONS, build_planted_shard


@pytest.fixture(scope="module")
def planted_root(tmp_path_factory):
    from speechdata.io.storage import DataRoot

    root = DataRoot(str(tmp_path_factory.mktemp("planted") / "data"))
    clean = build_planted_shard(root, "q1")
    assert not run_raw_shards(root, "q1").rejects
    assert not run_normalized_audio(root, "q1").rejects  # every defect reaches the quality stage
    run_quality_signals(root, "q1", vad_model=load_silero_model())
    run_quality_decisions(root, "q1", default_policies("tiny"))
    return root, clean


def test_every_planted_defect_is_rejected_with_its_own_reason_and_no_clean_utterance_is(planted_root):
    root, clean = planted_root
    excluded = excluded_utterances(root, "q1", "bridge")
    assert {utt_id: reason for utt_id, (reason, _) in excluded.items()} == PLANTED_REASONS
    assert not set(clean) & set(excluded)
    assert len(clean) == 8


def test_the_asr_preset_keeps_telephone_audio_the_bridge_rejects(planted_root):
    root, _ = planted_root
    assert excluded_utterances(root, "q1", "bridge")["planted_telephone_8k"][0] == "narrowband"
    assert "planted_telephone_8k" not in excluded_utterances(root, "q1", "asr")


def test_duckdb_reads_the_quality_files_with_no_options(planted_root):
    root, clean = planted_root
    signals = (
        duckdb.connect()
        .execute(f"SELECT count(*), count(bandwidth_hz) FROM '{root.path(quality_signals('q1'))}'")
        .fetchone()
    )
    assert signals == (len(clean) + len(PLANTED_REASONS),) * 2
    kept = (
        duckdb.connect()
        .execute(
            f"SELECT count(*) FROM '{root.path(quality_decisions('q1'))}' WHERE product = 'bridge' AND reason IS NULL"
        )
        .fetchone()
    )
    assert kept == (len(clean),)


def test_the_asr_ledger_balances_with_the_quality_reasons(planted_root):
    from speechdata.accounting.ledgers import produced_utterances, product_ledger
    from speechdata.asr.flac import run_asr_flac

    root, clean = planted_root
    excluded = excluded_utterances(root, "q1", "asr")
    summary = run_asr_flac(root, "q1", excluded=excluded)
    ledger = product_ledger(root, "q1", "asr", produced_utterances(root, "q1", "asr"))
    assert ledger.balanced
    assert ledger.landed == len(clean) + len(PLANTED_REASONS)
    assert ledger.rejected == len(excluded) == len(PLANTED_REASONS) - 1  # telephone audio is kept for ASR
    assert ledger.rejects_by_reason == {
        "clipped": 1,
        "language_mismatch": 2,
        "low_snr": 1,
        "mostly_silence": 1,
        "no_speech": 2,
    }
    assert {r.utt_id for r in summary.rejects} == set(excluded)
