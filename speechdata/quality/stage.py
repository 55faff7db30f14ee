"""The quality stages of one shard: measure every utterance's signals, then decide per product.

``run_quality_signals`` writes ``shards/<shard>/quality.parquet`` (one row per indexed utterance,
every signal of docs/quality.md). ``run_quality_decisions`` applies each product's
:class:`~speechdata.quality.policy.QualityPolicy` to it and writes
``shards/<shard>/quality_decisions.parquet``. Deciding is cheap and separate, so a policy change
re-decides without re-measuring. Both files are replaced whole on a re-run.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from speechdata.accounting.stage import StageSummary
from speechdata.alignment.greedy import greedy_hypotheses_path
from speechdata.alignment.pseudo_labels import TEXT_SOURCE_LANDED, with_text_sources
from speechdata.audio.codec import resample
from speechdata.audio.container import iter_container_utterances, read_container_index
from speechdata.audio.streamed import StreamedAudio
from speechdata.audio.truth import clipped_share
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.quality.audio_models import (
    MODEL_SAMPLE_RATE,
    AudioLanguageIdentifier,
    DnsmosScorer,
    SpeechQualityEstimator,
)
from speechdata.quality.long_form import measure_long_recording
from speechdata.quality.near_dup_flags import reject_flagged_near_duplicates
from speechdata.quality.paths import quality_decisions, quality_signals
from speechdata.quality.policy import QualityPolicy, decide_utterance, policies_digest
from speechdata.quality.schema import QUALITY_DECISIONS_SCHEMA, QUALITY_SIGNALS_SCHEMA
from speechdata.quality.signals import effective_bandwidth_hz, level_dbfs, silence_share, wada_snr_db
from speechdata.quality.speakers import SpeakerEncoder, SpeakerSignals, speaker_columns
from speechdata.quality.speech_signals import dc_offset_ratio, mains_hum_share, speech_snr_db
from speechdata.quality.text_language import identify_text_language
from speechdata.quality.transcript_checks import (
    hallucination_phrase,
    longest_character_run,
    most_repeated_ngram,
    ngram_repetition,
    speaking_rate,
)
from speechdata.vad.silero import VadParams, detect_speech

SIGNALS_STAGE = "quality_signals"
DECISIONS_STAGE = "quality_decisions"
CHUNK_AUDIO_S = 600.0
"""Audio held in memory at once while measuring (VAD and the models run per chunk)."""


def run_quality_signals(
    data_root: DataRoot,
    shard_id: str,
    *,
    vad_model,
    vad_params: VadParams = VadParams(),
    audio_language: AudioLanguageIdentifier | None = None,
    speech_quality: SpeechQualityEstimator | None = None,
    dnsmos: DnsmosScorer | None = None,
    speakers: SpeakerEncoder | None = None,
) -> StageSummary:
    """Measure every indexed utterance; one with no normalized audio (rejected upstream) gets a row
    with only its text signals. ``audio_language`` / ``speech_quality`` / ``dnsmos`` / ``speakers``:
    None leaves their columns null."""
    started = time.perf_counter()
    index = with_text_sources(
        data_root,
        shard_id,
        data_root.read_parquet(layout.utterance_index(shard_id), columns=["utt_id", "text", "language"]),
    )
    container = read_container_index(data_root, layout.normalized_audio(shard_id))
    source_clipping = dict(zip(container["utt_id"].to_pylist(), container["clipped_share"].to_pylist(), strict=True))
    agreement = _transcript_agreement(data_root, shard_id)
    rows: dict[str, dict] = {}
    texts: dict[str, str] = {}
    for row in index.to_pylist():
        # A pseudo-label is the model's reading in the landed language: text LID on it says nothing new.
        text_lid = identify_text_language(row["text"] if row["text_source"] == TEXT_SOURCE_LANDED else None)
        texts[row["utt_id"]] = row["text"] or ""
        rows[row["utt_id"]] = {
            "utt_id": row["utt_id"],
            "language": row["language"],
            "has_audio": False,
            "text_language": text_lid.language,
            "text_language_confidence": text_lid.confidence,
            "text_letters": text_lid.letters,
            "ngram_repetition": ngram_repetition(row["text"] or ""),
            "most_repeated_ngram": most_repeated_ngram(row["text"] or ""),
            "longest_character_run": longest_character_run(row["text"] or ""),
            "hallucination_phrase": hallucination_phrase(row["text"] or ""),
            **agreement.get(row["utt_id"], {}),
            "text_source": row["text_source"],
            "asr_confidence": row["asr_confidence"],
        }

    pending: list[tuple[str, np.ndarray, int]] = []
    speaker_evidence: dict[str, SpeakerSignals] = {}
    pending_s = 0.0
    audio_seconds = 0.0
    for utt_id, samples, rate in iter_container_utterances(data_root, layout.normalized_audio(shard_id), set(rows)):
        if isinstance(samples, StreamedAudio):  # past the whole-decode budget: measured window by window
            if pending:  # the utterances read so far first: their audio is not held through the recording's windows
                _measure_chunk(
                    pending, rows, texts, source_clipping, vad_model, vad_params, audio_language, speech_quality, dnsmos
                )
                audio_seconds += pending_s
                pending, pending_s = [], 0.0

            def measure(windows, window_rows):
                _measure_chunk(
                    windows, window_rows, {}, {}, vad_model, vad_params, audio_language, speech_quality, dnsmos
                )

            signals, speaker = measure_long_recording(utt_id, samples, rate, texts.get(utt_id, ""), measure, speakers)
            if source_clipping.get(utt_id) is not None:
                signals["clipped_share"] = float(source_clipping[utt_id])
            rows[utt_id].update(signals)
            if speaker is not None:
                speaker_evidence[utt_id] = speaker
            audio_seconds += samples.shape[0] / rate
            continue
        pending.append((utt_id, samples, rate))
        pending_s += samples.shape[0] / rate
        if pending_s >= CHUNK_AUDIO_S:
            audios_16k = _measure_chunk(
                pending, rows, texts, source_clipping, vad_model, vad_params, audio_language, speech_quality, dnsmos
            )
            _measure_speakers(pending, audios_16k, speakers, speaker_evidence)
            audio_seconds += pending_s
            pending, pending_s = [], 0.0
    if pending:
        audios_16k = _measure_chunk(
            pending, rows, texts, source_clipping, vad_model, vad_params, audio_language, speech_quality, dnsmos
        )
        _measure_speakers(pending, audios_16k, speakers, speaker_evidence)
        audio_seconds += pending_s

    for utt_id, columns in speaker_columns(speaker_evidence).items():
        rows[utt_id].update(columns)
    table = pa.Table.from_pylist([rows[u] for u in sorted(rows)], schema=QUALITY_SIGNALS_SCHEMA)
    data_root.write_parquet(quality_signals(shard_id), table)
    return StageSummary(
        shard_id=shard_id,
        rows_in=index.num_rows,
        rows_out=table.num_rows,
        rejects=[],
        audio_seconds=audio_seconds,
        compute_seconds=time.perf_counter() - started,
        outputs={"signals": data_root.uri(quality_signals(shard_id))},
    )


def _transcript_agreement(data_root: DataRoot, shard_id: str) -> dict[str, dict]:
    """CER and WER of the aligner's greedy transcript against the normalized landed text."""
    import jiwer

    relative = greedy_hypotheses_path(shard_id)
    if not data_root.exists(relative):
        return {}
    table = data_root.read_parquet(relative)
    agreement = {}
    for row in table.to_pylist():
        reference, hypothesis = row["reference"], row["hypothesis"]
        if not reference:
            continue
        agreement[row["utt_id"]] = {
            "hypothesis": hypothesis,
            "cer": float(jiwer.cer(reference, hypothesis)),
            "wer": float(jiwer.wer(reference, hypothesis)),
        }
    return agreement


def _measure_speakers(
    pending: list[tuple[str, np.ndarray, int]],
    audios_16k: list[np.ndarray],
    speakers: SpeakerEncoder | None,
    evidence: dict[str, SpeakerSignals],
) -> None:
    """The chunk's speaker evidence from its 16 kHz audio (the encoder's rate: not resampled again),
    its utterances' windows embedded together (far cheaper than one encoder call per utterance)."""
    if speakers is None:
        return
    found = speakers.signals_many([(audio, MODEL_SAMPLE_RATE) for audio in audios_16k])
    evidence.update(zip((utt_id for utt_id, _, _ in pending), found, strict=True))


def _measure_chunk(
    pending: list[tuple[str, np.ndarray, int]],
    rows: dict[str, dict],
    texts: dict[str, str],
    source_clipping: dict[str, float | None],
    vad_model,
    vad_params: VadParams,
    audio_language: AudioLanguageIdentifier | None,
    speech_quality: SpeechQualityEstimator | None,
    dnsmos: DnsmosScorer | None,
) -> list[np.ndarray]:
    """Measure the chunk's utterances into ``rows``; their audio at 16 kHz, for the speaker encoder."""
    audios_16k = [resample(samples, rate, MODEL_SAMPLE_RATE) for _, samples, rate in pending]
    speech = detect_speech(vad_model, audios_16k, vad_params)
    languages = audio_language.identify(audios_16k) if audio_language is not None else [(None, None)] * len(pending)
    scores = speech_quality.mos(audios_16k) if speech_quality is not None else [None] * len(pending)
    dnsmos_scores = dnsmos.score(audios_16k) if dnsmos is not None else [None] * len(pending)
    for (utt_id, samples, rate), audio_16k, segments, (language, confidence), mos, dns in zip(
        pending, audios_16k, speech, languages, scores, dnsmos_scores, strict=True
    ):
        duration_s = samples.shape[0] / rate
        clipping = source_clipping.get(utt_id)
        # The speaking rate's seconds are the VAD's speech: pauses between phrases do not count.
        speech_s = segments.speech_s if len(segments) else 0.0
        chars_per_s, words_per_s = speaking_rate(texts.get(utt_id, ""), speech_s)
        rows[utt_id].update(
            has_audio=True,
            duration_s=duration_s,
            level_dbfs=max(level_dbfs(samples), -200.0),
            clipped_share=float(clipping) if clipping is not None else clipped_share(samples),
            bandwidth_hz=effective_bandwidth_hz(samples, rate),
            snr_db=wada_snr_db(samples),
            silence_share=silence_share(samples, rate),
            speech_share=min(1.0, segments.speech_s / duration_s) if duration_s > 0 else 0.0,
            leading_silence_s=segments.start_s[0] if len(segments) else duration_s,
            trailing_silence_s=max(0.0, duration_s - segments.end_s[-1]) if len(segments) else duration_s,
            audio_language=language,
            audio_language_confidence=confidence,
            mos=mos,
            speech_s=speech_s,
            speech_snr_db=speech_snr_db(audio_16k, MODEL_SAMPLE_RATE, segments.start_s, segments.end_s),
            dc_offset_ratio=dc_offset_ratio(samples),
            mains_hum_share=mains_hum_share(audio_16k, MODEL_SAMPLE_RATE),
            chars_per_s=chars_per_s,
            words_per_s=words_per_s,
            dnsmos_sig=dns.sig if dns is not None else None,
            dnsmos_bak=dns.bak if dns is not None else None,
            dnsmos_ovrl=dns.ovrl if dns is not None else None,
        )
    return audios_16k


def run_quality_decisions(data_root: DataRoot, shard_id: str, policies: Mapping[str, QualityPolicy]) -> StageSummary:
    """One row per measured utterance and product: kept (``reason`` null) or the reason it fails the
    product's policy. An utterance without normalized audio gets no row: an earlier stage rejected it."""
    started = time.perf_counter()
    signals = data_root.read_parquet(quality_signals(shard_id))
    digest = policies_digest(policies)
    rows = []
    for row in signals.to_pylist():
        if not row["has_audio"]:
            continue
        for product, policy in sorted(policies.items()):
            decision = decide_utterance(row, policy)
            rows.append(
                {
                    "utt_id": row["utt_id"],
                    "product": product,
                    "reason": decision.reason,
                    "detail": decision.detail,
                    "keep_start_s": decision.keep_start_s,
                    "keep_end_s": decision.keep_end_s,
                    "policy_sha256": digest,
                }
            )
    reject_flagged_near_duplicates(data_root, shard_id, policies, rows)
    table = pa.Table.from_pylist(rows, schema=QUALITY_DECISIONS_SCHEMA)
    data_root.write_parquet(quality_decisions(shard_id), table)
    return StageSummary(
        shard_id=shard_id,
        rows_in=signals.num_rows,
        rows_out=sum(1 for r in rows if r["reason"] is None),
        rejects=[],
        audio_seconds=0.0,
        compute_seconds=time.perf_counter() - started,
        outputs={"decisions": data_root.uri(quality_decisions(shard_id))},
    )
