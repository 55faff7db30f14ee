"""The quality files' schemas, every column described (docs/quality.md has the units and defaults)."""

from __future__ import annotations

import pyarrow as pa


def _field(name: str, type_: pa.DataType, description: str, nullable: bool = True) -> pa.Field:
    return pa.field(name, type_, nullable=nullable, metadata={"description": description})


QUALITY_SIGNALS_SCHEMA = pa.schema(
    [
        _field("utt_id", pa.string(), "The utterance (one row per indexed utterance).", nullable=False),
        _field("language", pa.string(), "The landed language label."),
        _field("has_audio", pa.bool_(), "Whether the utterance has normalized audio (else rejected upstream).", False),
        _field("duration_s", pa.float64(), "Duration of the normalized audio, seconds."),
        _field("level_dbfs", pa.float64(), "RMS level, dB relative to full scale."),
        _field("clipped_share", pa.float64(), "Share (0-1) of the source samples at full scale."),
        _field("bandwidth_hz", pa.float64(), "Effective bandwidth: highest frequency holding real energy, Hz."),
        _field("snr_db", pa.float64(), "WADA-SNR estimate, dB (clamped to -20..100)."),
        _field("silence_share", pa.float64(), "Share (0-1) of 30 ms frames below -50 dBFS."),
        _field("speech_share", pa.float64(), "Share (0-1) of the duration Silero VAD marks as speech."),
        _field("leading_silence_s", pa.float64(), "Seconds before the first VAD speech segment."),
        _field("trailing_silence_s", pa.float64(), "Seconds after the last VAD speech segment."),
        _field("speech_s", pa.float64(), "Seconds Silero VAD marks as speech (the speaking rate's denominator)."),
        _field("speech_snr_db", pa.float64(), "VAD-based SNR: speech-frame over non-speech-frame power, dB."),
        _field("dc_offset_ratio", pa.float64(), "|mean| / RMS of the normalized audio (after DC removal)."),
        _field("mains_hum_share", pa.float64(), "Share (0-1) of the power in narrow 50/60 Hz lines and harmonics."),
        _field("chars_per_s", pa.float64(), "Letters of the transcript per second of VAD speech."),
        _field("words_per_s", pa.float64(), "Words of the transcript per second of VAD speech."),
        _field("ngram_repetition", pa.float64(), "Share (0-1) of word trigrams repeating an earlier one."),
        _field("most_repeated_ngram", pa.int64(), "Occurrences of the transcript's most frequent word trigram."),
        _field("longest_character_run", pa.int64(), "Longest run of one repeated letter or digit in the transcript."),
        _field("hallucination_phrase", pa.string(), "A stock hallucinated phrase the transcript holds (else null)."),
        _field("text_language", pa.string(), "Text LID (py3langid) language of the transcript, ISO 639-1."),
        _field("text_language_confidence", pa.float64(), "Text LID probability (0-1) of text_language."),
        _field("text_letters", pa.int64(), "Letters in the transcript (text LID is not trusted on short text)."),
        _field("hypothesis", pa.string(), "The aligner's greedy CTC transcript (null: not aligned by CTC)."),
        _field("cer", pa.float64(), "Character error rate of the greedy transcript vs the normalized landed text."),
        _field("wer", pa.float64(), "Word error rate of the greedy transcript vs the normalized landed text."),
        _field("text_source", pa.string(), "'landed' or 'asr' (no text landed: the aligner's pseudo-label)."),
        _field("asr_confidence", pa.float64(), "The pseudo-label's confidence, 0-1 (null for landed text)."),
        _field(
            "speaker_embedding",
            pa.list_(pa.float32(), 256),
            "Resemblyzer speaker embedding, 256 floats, L2-normalized (null: under 0.5 s of sound or no audio).",
        ),
        _field("speaker_count", pa.int64(), "Speakers among the utterance's 1.6 s windows (0: no embedding)."),
        _field("speaker_overlap", pa.bool_(), "Windows disagree: a speaker change, a second voice or crosstalk."),
        _field(
            "speaker_cluster",
            pa.int64(),
            "Speaker cluster in the shard (average-linkage, cosine >= 0.83; numbered in utt_id order).",
        ),
        _field("audio_language", pa.string(), "Audio LID language (null: no audio-LID model)."),
        _field("audio_language_confidence", pa.float64(), "Audio LID probability (0-1) of audio_language."),
        _field("mos", pa.float64(), "Speech-quality MOS estimate, 1-5 (null: no MOS model)."),
        _field("dnsmos_sig", pa.float64(), "DNSMOS P.835 speech quality (SIG), 1-5."),
        _field("dnsmos_bak", pa.float64(), "DNSMOS P.835 background quality (BAK), 1-5."),
        _field("dnsmos_ovrl", pa.float64(), "DNSMOS P.835 overall quality (OVRL), 1-5."),
    ]
)

QUALITY_DECISIONS_SCHEMA = pa.schema(
    [
        _field("utt_id", pa.string(), "The utterance.", nullable=False),
        _field("product", pa.string(), "The product line the decision is for.", nullable=False),
        _field("reason", pa.string(), "Null: kept. Otherwise the quality reject reason."),
        _field("detail", pa.string(), "For people: the value and the limit of every failed filter."),
        _field("keep_start_s", pa.float64(), "Kept with edge silence trimmed: the kept span's start, s (else null)."),
        _field("keep_end_s", pa.float64(), "Kept with edge silence trimmed: the kept span's end, s (else null)."),
        _field(
            "policy_sha256", pa.string(), "Digest of every product's thresholds the decision was taken under.", False
        ),
    ]
)
