"""Speaking rate, DC, hum, babble, duration, edge silence and transcript repetition: under the tiny
profile's default policies (DNSMOS real, as in every profile) every planted defect is rejected with
its own reason, and none of sixteen clean utterances of varied voices, speeds and pitches is.

``tests/unit/test_quality_planted_corpus.py`` holds the first pass's defects (language labels,
telephone audio, clipping, silence, music, white noise) beside the sample recordings.
"""

import duckdb
import numpy as np
import pytest

from speechdata.audio.container import iter_container_audio
from speechdata.io import layout
from speechdata.landing.ingest import run_normalized_audio, run_raw_shards
from speechdata.quality.decisions import excluded_utterances
from speechdata.quality.dnsmos import Dnsmos
from speechdata.quality.paths import quality_decisions, quality_signals
from speechdata.quality.policy import default_policies
from speechdata.quality.stage import run_quality_decisions, run_quality_signals
from speechdata.quality.trims import kept_spans
from speechdata.vad.silero import load_silero_model
from tests.quality_corpus import ASR_TRIMMED, REPAIRED, SECOND_PASS_REASONS, build_planted_shard

# DNSMOS scores every utterance (about 0.1-0.5 s of CPU per 9 s window): heavier than a unit test.
pytestmark = pytest.mark.slow

BRIDGE_REASONS = SECOND_PASS_REASONS
ASR_KEEPS = {ASR_TRIMMED}
TRANSLATION_KEEPS = {"planted_too_long"}  # streaming segments are cut from long audio


@pytest.fixture(scope="module")
def planted_root(tmp_path_factory):
    from speechdata.io.storage import DataRoot

    root = DataRoot(str(tmp_path_factory.mktemp("planted") / "data"))
    clean = build_planted_shard(root, "q1", n_clean=0, first_pass=False, second_pass=True)
    assert not run_raw_shards(root, "q1").rejects
    assert not run_normalized_audio(root, "q1").rejects  # every defect reaches the quality stage
    run_quality_signals(root, "q1", vad_model=load_silero_model(), dnsmos=Dnsmos())
    run_quality_decisions(root, "q1", default_policies("tiny"))
    return root, clean


def reasons(root, product: str) -> dict[str, str]:
    return {utt_id: reason for utt_id, (reason, _) in excluded_utterances(root, "q1", product).items()}


def test_every_planted_defect_is_rejected_with_its_own_reason_and_no_clean_utterance_is(planted_root):
    root, clean = planted_root
    assert reasons(root, "bridge") == BRIDGE_REASONS
    assert len(clean) == 16
    for product in ("bridge", "asr", "translation"):
        assert not set(clean) & set(reasons(root, product)), product
        assert not set(REPAIRED) & set(reasons(root, product)), product


def test_each_product_rejects_what_its_preset_rejects(planted_root):
    root, _ = planted_root
    expected_asr = {u: r for u, r in BRIDGE_REASONS.items() if u not in ASR_KEEPS}
    assert reasons(root, "asr") == expected_asr
    expected_translation = {u: r for u, r in BRIDGE_REASONS.items() if u not in TRANSLATION_KEEPS}
    assert reasons(root, "translation") == expected_translation


def test_babble_reads_as_speech_to_the_energy_estimates_but_not_to_dnsmos(planted_root):
    """0 dB babble (four other voices): both SNR estimates read it several dB above its true 0 dB;
    DNSMOS's background score puts it far under every clean utterance."""
    root, clean = planted_root
    rows = {r["utt_id"]: r for r in root.read_parquet(quality_signals("q1")).to_pylist()}
    babble = rows["planted_babble"]
    assert 3.0 < babble["snr_db"] < 10.0 and 3.0 < babble["speech_snr_db"] < 10.0
    clean_background = min(rows[u]["dnsmos_bak"] for u in clean)
    assert babble["dnsmos_bak"] < 2.2 < 2.6 < clean_background
    detail = dict(excluded_utterances(root, "q1", "bridge"))["planted_babble"][1]
    assert "noisy_background" in detail and "low_speech_snr" in detail


def test_a_constant_dc_offset_is_removed_by_normalization_and_a_drifting_one_is_rejected(planted_root):
    root, _ = planted_root
    audio = dict(
        (u, s)
        for u, s, _ in iter_container_audio(root, layout.normalized_audio("q1"), set(REPAIRED) | {"planted_dc_drift"})
    )
    constant = audio["planted_dc_constant"]
    assert abs(float(np.mean(constant))) < 0.01 * float(np.sqrt(np.mean(constant**2)))
    assert float(np.mean(audio["planted_dc_drift"])) > 0.1
    rows = {r["utt_id"]: r for r in root.read_parquet(quality_signals("q1")).to_pylist()}
    assert rows["planted_dc_drift"]["snr_db"] > 15  # no longer misread as noise
    assert reasons(root, "bridge")["planted_dc_drift"] == "dc_offset"


def test_the_asr_product_extracts_the_trimmed_span_of_long_edge_silence(planted_root):
    from speechdata.asr.flac import run_asr_flac

    root, _ = planted_root
    spans = kept_spans(root, "q1", "asr")
    assert set(spans) == {ASR_TRIMMED}
    start, end = spans[ASR_TRIMMED]
    rows = {r["utt_id"]: r for r in root.read_parquet(quality_signals("q1")).to_pylist()}
    silence = rows[ASR_TRIMMED]
    assert start == pytest.approx(silence["leading_silence_s"] - 0.2, abs=0.01)
    assert end == pytest.approx(silence["duration_s"] - silence["trailing_silence_s"] + 0.2, abs=0.01)
    run_asr_flac(root, "q1", excluded=excluded_utterances(root, "q1", "asr"), kept_spans=spans)
    index = {r["utt_id"]: r for r in root.read_parquet(layout.asr_flac_index("q1")).to_pylist()}
    assert index[ASR_TRIMMED]["duration_s"] == pytest.approx(end - start, abs=0.01)


def test_duckdb_reads_the_quality_files_with_no_options(planted_root):
    root, clean = planted_root
    planted = len(BRIDGE_REASONS) + len(REPAIRED)
    signals = (
        duckdb.connect()
        .execute(f"SELECT count(*), count(bandwidth_hz), count(dnsmos_ovrl) FROM '{root.path(quality_signals('q1'))}'")
        .fetchone()
    )
    assert signals == (len(clean) + planted,) * 3
    kept = (
        duckdb.connect()
        .execute(
            f"SELECT count(*) FROM '{root.path(quality_decisions('q1'))}' WHERE product = 'bridge' AND reason IS NULL"
        )
        .fetchone()
    )
    assert kept == (len(clean) + len(REPAIRED),)


def test_the_asr_ledger_balances_with_the_quality_reasons(planted_root):
    from speechdata.accounting.ledgers import produced_utterances, product_ledger
    from speechdata.asr.flac import run_asr_flac

    root, clean = planted_root
    excluded = excluded_utterances(root, "q1", "asr")
    summary = run_asr_flac(root, "q1", excluded=excluded, kept_spans=kept_spans(root, "q1", "asr"))
    ledger = product_ledger(root, "q1", "asr", produced_utterances(root, "q1", "asr"))
    assert ledger.balanced
    assert ledger.landed == len(clean) + len(BRIDGE_REASONS) + len(REPAIRED)
    assert ledger.rejected == len(excluded) == len(BRIDGE_REASONS) - len(ASR_KEEPS)
    counts: dict[str, int] = {}
    for utt_id, reason in BRIDGE_REASONS.items():
        if utt_id not in ASR_KEEPS:
            counts[reason] = counts.get(reason, 0) + 1
    assert ledger.rejects_by_reason == counts
    assert {r.utt_id for r in summary.rejects} == set(excluded)
