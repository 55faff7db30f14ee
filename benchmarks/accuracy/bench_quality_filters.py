"""The quality filters on the planted shard: recall per defect and false positives on clean speech,
the current filters beside the second pass's, and the CPU cost of the new signals and DNSMOS.

Why: every quality reject removes an utterance from a product, so a filter is worth what it catches
(recall per planted defect, and whether its reason is the fitting one) against what it wrongly
takes (clean utterances of varied voices, speeds and pitches rejected). The planted shard is
``tests/quality_corpus.py``: the first pass's defects (wrong language labels, telephone audio,
clipping, near-silence, music, 0 dB white noise), the second pass's (audio cut to half under its
transcript, an extra sentence, words missing, a drifting and a constant DC offset, 50 Hz hum,
0 dB babble of four other voices, too short, too long, long edge silence, a looped transcript, a
stock hallucinated phrase), 8 sample utterances and 16 clean varied voices.

The baseline ("current") is the pipeline before the second pass, in the same run: normalization
without DC removal and the policy with every second-pass filter off. Cost: CPU seconds per hour of
audio of the signals the current stage computes (level, clipping, bandwidth, WADA-SNR, silence,
Silero VAD) against the new DSP signals (DC, hum, VAD SNR, speaking rate, repetition) and DNSMOS
(one onnxruntime thread), on the same utterances, as ratios.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from unittest import mock

from benchmarks.report import emit, progress, ratio, stdout_to_stderr, timed_call
from speechdata.audio.codec import resample
from speechdata.audio.container import iter_container_audio
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.ingest import run_normalized_audio, run_raw_shards
from speechdata.quality.decisions import excluded_utterances
from speechdata.quality.dnsmos import Dnsmos
from speechdata.quality.policy import RULES, default_policies
from speechdata.quality.signals import effective_bandwidth_hz, level_dbfs, silence_share, wada_snr_db
from speechdata.quality.speech_signals import dc_offset_ratio, mains_hum_share, speech_snr_db
from speechdata.quality.stage import run_quality_decisions, run_quality_signals
from speechdata.quality.transcript_checks import longest_character_run, ngram_repetition, speaking_rate
from speechdata.vad.silero import VadParams, detect_speech, load_silero_model
from tests.quality_corpus import PLANTED_REASONS, REPAIRED, SECOND_PASS_REASONS, build_planted_shard

CURRENT_REASONS = (
    "mostly_silence",
    "no_speech",
    "clipped",
    "narrowband",
    "low_snr",
    "language_mismatch",
    "transcript_mismatch",
    "audio_language_mismatch",
    "low_mos",
)
"""The filters before the second pass; every other reason of :data:`RULES` is new."""
NEW_REASONS = [rule.reason for rule in RULES if rule.reason not in CURRENT_REASONS]
PRODUCTS = ("bridge", "asr", "translation")


def current_policies():
    return {p: policy.with_overrides({}, NEW_REASONS) for p, policy in default_policies("tiny").items()}


def measured_shard(root: DataRoot, remove_dc: bool, dnsmos) -> list[str]:
    clean = build_planted_shard(root, "q1", second_pass=True)
    run_raw_shards(root, "q1")
    if remove_dc:
        run_normalized_audio(root, "q1")
    else:
        with mock.patch("speechdata.landing.normalize.remove_dc_offset", lambda mono, rate: mono):
            run_normalized_audio(root, "q1")
    run_quality_signals(root, "q1", vad_model=load_silero_model(), dnsmos=dnsmos)
    return clean


def verdicts(root: DataRoot, policies) -> dict[str, dict[str, str]]:
    run_quality_decisions(root, "q1", policies)
    return {p: {u: r for u, (r, _) in excluded_utterances(root, "q1", p).items()} for p in PRODUCTS}


def scored(rejected: dict[str, dict[str, str]], clean: list[str]) -> dict:
    planted = {**PLANTED_REASONS, **SECOND_PASS_REASONS}
    figures = {}
    for product in PRODUCTS:
        found = rejected[product]
        figures[product] = {
            "per_defect": {u: found.get(u) for u in sorted(planted)},
            "repaired_kept": {u: u not in found for u in REPAIRED},
            "recall_any_reason": round(sum(u in found for u in planted) / len(planted), 4),
            "recall_fitting_reason": round(sum(found.get(u) == r for u, r in planted.items()) / len(planted), 4),
            "false_positive_rate_clean": round(sum(u in found for u in clean) / len(clean), 4),
            "clean_rejected": sorted(u for u in clean if u in found),
        }
    return figures


def signal_costs(root: DataRoot, dnsmos: Dnsmos) -> dict:
    audio = [(samples, rate) for _, samples, rate in iter_container_audio(root, layout.normalized_audio("q1"), None)]
    hours = sum(s.shape[0] / r for s, r in audio) / 3600.0
    vad = load_silero_model()

    def current_signals() -> tuple[list, list]:
        audios_16k = [resample(s, r, 16_000) for s, r in audio]
        segments = detect_speech(vad, audios_16k, VadParams())
        for samples, rate in audio:
            (
                level_dbfs(samples),
                effective_bandwidth_hz(samples, rate),
                wada_snr_db(samples),
                silence_share(samples, rate),
            )
        return audios_16k, segments

    def new_dsp_signals() -> None:
        for (samples, _), audio_16k, found in zip(audio, audios_16k, segments, strict=True):
            dc_offset_ratio(samples), mains_hum_share(audio_16k, 16_000)
            speech_snr_db(audio_16k, 16_000, found.start_s, found.end_s)
            speaking_rate("a sentence of ordinary length read at an ordinary pace", found.speech_s)
            ngram_repetition("a sentence of ordinary length"), longest_character_run("a sentence")

    current_s, (audios_16k, segments) = timed_call(current_signals, clock=time.process_time)
    new_dsp_s, _ = timed_call(new_dsp_signals, clock=time.process_time)
    dnsmos_s, _ = timed_call(lambda: dnsmos.score(audios_16k), clock=time.process_time)
    per_hour = {
        "current_signals": round(current_s / hours, 1),
        "new_dsp_signals": round(new_dsp_s / hours, 1),
        "dnsmos": round(dnsmos_s / hours, 1),
    }
    return {
        "audio_hours": round(hours, 4),
        "utterances": len(audio),
        "cpu_s_per_audio_hour": per_hour,
        "ratio_new_dsp_over_current": ratio(new_dsp_s, current_s),
        "ratio_dnsmos_over_current": ratio(dnsmos_s, current_s),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the same shard (it is small already)")
    args = parser.parse_args(argv)
    with stdout_to_stderr(), tempfile.TemporaryDirectory() as tmp:
        dnsmos = Dnsmos(threads=1)
        current_root, new_root = DataRoot(f"{tmp}/current"), DataRoot(f"{tmp}/new")
        clean = measured_shard(current_root, remove_dc=False, dnsmos=None)
        current = scored(verdicts(current_root, current_policies()), clean)
        progress("current filters measured")
        measured_shard(new_root, remove_dc=True, dnsmos=dnsmos)
        second = scored(verdicts(new_root, default_policies("tiny")), clean)
        progress("second-pass filters measured")
        figures = {
            "clean_utterances": len(clean),
            "planted_defects": len(PLANTED_REASONS) + len(SECOND_PASS_REASONS),
            "current": current,
            "second_pass": second,
            "cost": signal_costs(new_root, dnsmos),
        }
    emit("quality_filters", {"quick": args.quick, "profile": "tiny"}, figures)


if __name__ == "__main__":
    main()
