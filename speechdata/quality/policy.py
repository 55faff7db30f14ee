"""The quality policy: thresholds that turn an utterance's signals into one reject reason, per product.

Every threshold is a field with a documented default (docs/quality.md); ``None`` turns its filter
off. Each product line has a named preset (:data:`PRESETS`): the bridge is the strictest, ASR keeps
narrow-band (telephone) audio, translation sits between. Rules are checked in :data:`RULES` order
and the first that fails is the reason; the detail names every rule that failed, with the value and
the limit, so a person sees all of an utterance's problems. A signal that was not measured (no
greedy hypothesis, no audio-LID model) never fails its rule.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from speechdata.quality.text_language import primary_language
from speechdata.quality.transcript_checks import UNSPACED_LANGUAGES, rate_bounds


@dataclass(frozen=True)
class QualityPolicy:
    """One product's thresholds (units in the names); ``None`` turns a filter off."""

    min_duration_s: float | None = 0.5
    """``too_short``: less audio than this (after any edge-silence trim), seconds."""
    max_duration_s: float | None = 30.0
    """``too_long``: more audio than this (after any edge-silence trim), seconds."""
    max_silence_share: float | None = 0.8
    """``mostly_silence``: more than this share of 30 ms frames below -50 dBFS."""
    min_speech_share: float | None = 0.3
    """``no_speech``: Silero VAD finds speech in less than this share of the duration (music, tones, noise)."""
    max_edge_silence_s: float | None = 1.5
    """``long_edge_silence``: more non-speech than this before the first or after the last VAD speech
    segment, where the product does not trim it (``trim_edge_silence``)."""
    trim_edge_silence: bool = False
    """Trim an edge over ``max_edge_silence_s`` down to ``edge_silence_margin_s`` and judge the rest,
    instead of rejecting: only for products whose stage cuts the trimmed span (ASR's FLAC extraction)."""
    edge_silence_margin_s: float = 0.2
    """Non-speech kept before and after the speech when an edge is trimmed."""
    max_dc_offset_ratio: float | None = 0.1
    """``dc_offset``: ``|mean| / RMS`` above this after normalization (which removes a constant offset;
    what is left drifts, steps, or was driven into full scale)."""
    max_mains_hum_share: float | None = 0.04
    """``mains_hum``: more than this share of the power in narrow 50/60 Hz lines and their harmonics."""
    max_clipped_share: float | None = 0.001
    """``clipped``: more than this share of the source samples at full scale (normalization rejects above 5 %)."""
    min_bandwidth_hz: float | None = 5000.0
    """``narrowband``: effective bandwidth below this (8 kHz telephone audio reads about 4 kHz)."""
    min_snr_db: float | None = 10.0
    """``low_snr``: WADA-SNR estimate below this."""
    min_speech_snr_db: float | None = 10.0
    """``low_speech_snr``: speech-frame over non-speech-frame power (VAD based) below this; unlike
    WADA-SNR it is not fooled by babble (other voices under the speech)."""
    min_text_language_confidence: float | None = 0.8
    """``language_mismatch``: the text LID names another language than the landed one with at least this confidence."""
    min_text_language_letters: int = 12
    """Transcripts with fewer letters are never judged by text LID (too short to tell)."""
    max_speaking_rate_factor: float | None = 1.0
    """``speaking_rate_too_fast``: letters (or words) per second of speech above the language's
    maximum (:data:`~speechdata.quality.transcript_checks.SPEAKING_RATE_BOUNDS`) times this."""
    min_speaking_rate_factor: float | None = 1.0
    """``speaking_rate_too_slow``: letters (or words) per second of speech below the language's minimum times this."""
    max_ngram_repetition: float | None = 0.4
    """``transcript_repetition``: more than this share of the word trigrams repeat an earlier one and
    one trigram occurs more than ``max_ngram_repeats`` times (a phrase looped); or a character run
    longer than ``max_character_run``; or a stock hallucinated phrase."""
    max_ngram_repeats: int = 3
    """A sentence read twice or three times over is speech; a phrase looped four times and more is a
    recognizer stuck (both conditions must hold, so a long transcript's common trigram does not fail)."""
    max_character_run: int = 6
    """Longer runs of one letter or digit are a hallucination (no word holds seven of one letter)."""
    max_cer: float | None = 0.3
    """``transcript_mismatch``: the aligner's greedy transcript differs from the landed text by more than this CER."""
    min_asr_confidence: float | None = 0.7
    """``low_asr_confidence``: no text landed and the aligner's pseudo-label has a confidence (mean max
    posterior of its words' frames, 0-1) below this."""
    reject_other_speaker_readings: bool = False
    """``near_duplicate``: also reject an ``other_speaker_reading`` (an earlier utterance's transcript
    read by another speaker, docs/near-duplicates.md). Off in every preset: many speakers per prompt
    is what read-speech ASR and TTS corpora are made of."""
    cer_languages: tuple[str, ...] | None = None
    """Languages ``transcript_mismatch`` judges (None: every language): those whose aligner is trained."""
    min_audio_language_confidence: float | None = 0.7
    """``audio_language_mismatch``: the audio LID names another language with at least this confidence."""
    min_mos: float | None = 3.0
    """``low_mos``: the speech-quality model's MOS estimate (1-5) below this."""
    min_dnsmos_bak: float | None = 2.5
    """``noisy_background``: DNSMOS P.835 background quality (1-5) below this; a real model in every
    profile, and the one noise signal babble does not fool."""
    min_dnsmos_ovrl: float | None = None
    """``low_dnsmos``: DNSMOS P.835 overall quality (1-5) below this. Off by default: synthetic and
    read speech of plain voices scores 1.5-3.1 when clean (docs/quality.md, "DNSMOS")."""

    def with_overrides(
        self, thresholds: Mapping[str, float | None], disabled: list[str] | tuple[str, ...] = ()
    ) -> QualityPolicy:
        """This policy with some thresholds replaced and some filters (by reason) turned off."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(thresholds) - names)
        if unknown:
            raise ValueError(f"quality policy: unknown threshold(s) {unknown}; known: {sorted(names)}")
        reasons = {rule.reason: rule.threshold for rule in RULES}
        unknown = sorted(set(disabled) - set(reasons))
        if unknown:
            raise ValueError(f"quality policy: unknown filter(s) {unknown} in disabled; known: {sorted(reasons)}")
        return dataclasses.replace(self, **dict(thresholds), **{reasons[r]: None for r in disabled})

    def without_model_filters(self) -> QualityPolicy:
        """The filters that need a trained model off (the ``tiny`` profile's models are random)."""
        return dataclasses.replace(
            self, max_cer=None, min_asr_confidence=None, min_audio_language_confidence=None, min_mos=None
        )

    def with_trained_aligner_only(self, languages: tuple[str, ...], max_cer: float) -> QualityPolicy:
        """``transcript_mismatch`` for ``languages`` at ``max_cer`` (the ``small`` profile's trained
        aligner); the other model filters off (its audio-LID and MOS models are the tiny, random ones)."""
        return dataclasses.replace(
            self, max_cer=max_cer, cer_languages=languages, min_audio_language_confidence=None, min_mos=None
        )


PRESETS: dict[str, QualityPolicy] = {
    "bridge": QualityPolicy(min_snr_db=15.0, min_speech_snr_db=15.0, min_dnsmos_bak=2.6, max_cer=0.25),
    # Telephone audio is worth training ASR on; the model filters are a little looser. ASR's FLAC
    # extraction cuts a trimmed span, so long edge silence is trimmed there rather than rejected.
    "asr": QualityPolicy(min_bandwidth_hz=3000.0, max_cer=0.35, min_mos=2.5, trim_edge_silence=True),
    # Streaming segments are cut from long recordings: no upper duration limit.
    "translation": QualityPolicy(max_duration_s=None),
}
"""The named preset of each product line that applies a quality policy."""

SMALL_PROFILE_MAX_CER = 0.6
"""``transcript_mismatch`` in ``small``, for every product: the small aligner's greedy CER with the
right transcript is 0.10-0.34 on held-out speech and at most 0.56 on the demo's clips; with another
utterance's transcript 0.68 or more; on the first third of the audio 0.64-0.85. Half the audio scores
about 0.5 even for a perfect model, so audio cut short by half is the speaking-rate filter's
(``speaking_rate_too_fast``, model-free); tests/unit/test_transcript_mismatch_small.py."""

MODEL_FILTER_REASONS = ("transcript_mismatch", "low_asr_confidence", "audio_language_mismatch", "low_mos")
"""Filters whose signal comes from a trained model: computed in every profile, off by default in
``tiny``; ``small`` keeps ``transcript_mismatch`` for the languages its aligner was trained on."""


def default_policies(profile: str) -> dict[str, QualityPolicy]:
    """Every product's preset as the profile applies it: ``tiny`` turns the model filters off,
    ``small`` keeps ``transcript_mismatch`` for its trained aligner's languages."""
    from speechdata.profiles import SMALL_ALIGNER_LANGUAGES

    if profile == "tiny":
        return {product: policy.without_model_filters() for product, policy in PRESETS.items()}
    if profile == "small":
        return {
            product: policy.with_trained_aligner_only(SMALL_ALIGNER_LANGUAGES, SMALL_PROFILE_MAX_CER)
            for product, policy in PRESETS.items()
        }
    return dict(PRESETS)


def policies_digest(policies: Mapping[str, QualityPolicy]) -> str:
    """A short SHA-256 of every product's thresholds: part of the decisions' data version."""
    canonical = json.dumps(
        {product: dataclasses.asdict(policy) for product, policy in sorted(policies.items())}, sort_keys=True
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Rule:
    """One filter: the reject reason, the policy field holding its limit, and the test on a signals row."""

    reason: str
    threshold: str
    fails: Callable[[dict, QualityPolicy, object], str | None]
    """``(signals row, policy, limit) -> detail`` when the utterance fails, else None."""


def _above(column: str, unit: str = "") -> Callable[[dict, QualityPolicy, object], str | None]:
    def fails(row: dict, policy: QualityPolicy, limit) -> str | None:
        value = row.get(column)
        if value is None or value <= limit:
            return None
        return f"{column} {value:.4g}{unit} > {limit:g}{unit}"

    return fails


def _below(column: str, unit: str = "") -> Callable[[dict, QualityPolicy, object], str | None]:
    def fails(row: dict, policy: QualityPolicy, limit) -> str | None:
        value = row.get(column)
        if value is None or value >= limit:
            return None
        return f"{column} {value:.4g}{unit} < {limit:g}{unit}"

    return fails


def _speaking_rate(fast: bool) -> Callable[[dict, QualityPolicy, object], str | None]:
    def fails(row: dict, policy: QualityPolicy, factor) -> str | None:
        bounds = rate_bounds(row.get("language"))
        checks = [("chars_per_s", bounds.max_chars_per_s if fast else bounds.min_chars_per_s)]
        if primary_language(row.get("language")) not in UNSPACED_LANGUAGES:
            checks.append(("words_per_s", bounds.max_words_per_s if fast else bounds.min_words_per_s))
        for column, bound in checks:
            value, limit = row.get(column), bound * factor
            if value is None:
                continue
            if (value > limit) if fast else (value < limit):
                return f"{column} {value:.3g} {'>' if fast else '<'} {limit:.3g} ({row.get('language')})"
        return None

    return fails


def _repetition_fails(row: dict, policy: QualityPolicy, limit) -> str | None:
    found = []
    repetition, repeats = row.get("ngram_repetition"), row.get("most_repeated_ngram")
    if repetition is not None and repetition > limit and (repeats or 0) > policy.max_ngram_repeats:
        found.append(f"ngram_repetition {repetition:.3g} > {limit:g}, a trigram {repeats} times")
    run = row.get("longest_character_run")
    if run is not None and run > policy.max_character_run:
        found.append(f"longest_character_run {run} > {policy.max_character_run}")
    if row.get("hallucination_phrase"):
        found.append(f"stock phrase {row['hallucination_phrase']!r}")
    return ", ".join(found) or None


def _edge_silence_fails(row: dict, policy: QualityPolicy, limit) -> str | None:
    found = [
        f"{column} {row[column]:.3g} s > {limit:g} s"
        for column in ("leading_silence_s", "trailing_silence_s")
        if row.get(column) is not None and row[column] > limit
    ]
    return ", ".join(found) or None


def _language_fails(prefix: str, min_letters: bool) -> Callable[[dict, QualityPolicy, object], str | None]:
    def fails(row: dict, policy: QualityPolicy, limit) -> str | None:
        found, confidence = row.get(f"{prefix}_language"), row.get(f"{prefix}_language_confidence")
        landed = primary_language(row.get("language"))
        if found is None or confidence is None or landed is None or confidence < limit:
            return None
        if min_letters and (row.get("text_letters") or 0) < policy.min_text_language_letters:
            return None
        if primary_language(found) == landed:
            return None
        return f"{prefix} LID says {found!r} ({confidence:.2f} >= {limit:g}), landed as {row.get('language')!r}"

    return fails


def _cer_fails(row: dict, policy: QualityPolicy, limit) -> str | None:
    if policy.cer_languages is not None and primary_language(row.get("language")) not in policy.cer_languages:
        return None
    return _above("cer")(row, policy, limit)


RULES: tuple[Rule, ...] = (
    Rule("mostly_silence", "max_silence_share", _above("silence_share")),
    Rule("no_speech", "min_speech_share", _below("speech_share")),
    Rule("too_short", "min_duration_s", _below("duration_s", " s")),
    Rule("too_long", "max_duration_s", _above("duration_s", " s")),
    Rule("long_edge_silence", "max_edge_silence_s", _edge_silence_fails),
    Rule("dc_offset", "max_dc_offset_ratio", _above("dc_offset_ratio")),
    Rule("mains_hum", "max_mains_hum_share", _above("mains_hum_share")),
    Rule("clipped", "max_clipped_share", _above("clipped_share")),
    Rule("narrowband", "min_bandwidth_hz", _below("bandwidth_hz", " Hz")),
    Rule("low_snr", "min_snr_db", _below("snr_db", " dB")),
    Rule("low_speech_snr", "min_speech_snr_db", _below("speech_snr_db", " dB")),
    Rule("noisy_background", "min_dnsmos_bak", _below("dnsmos_bak")),
    Rule("language_mismatch", "min_text_language_confidence", _language_fails("text", min_letters=True)),
    Rule("transcript_repetition", "max_ngram_repetition", _repetition_fails),
    Rule("speaking_rate_too_fast", "max_speaking_rate_factor", _speaking_rate(fast=True)),
    Rule("speaking_rate_too_slow", "min_speaking_rate_factor", _speaking_rate(fast=False)),
    Rule("transcript_mismatch", "max_cer", _cer_fails),
    Rule("low_asr_confidence", "min_asr_confidence", _below("asr_confidence")),
    Rule("audio_language_mismatch", "min_audio_language_confidence", _language_fails("audio", min_letters=False)),
    Rule("low_mos", "min_mos", _below("mos")),
    Rule("low_dnsmos", "min_dnsmos_ovrl", _below("dnsmos_ovrl")),
)
"""Every filter, in the order that picks an utterance's reason: what the audio is (silence, not
speech, its length) before how it was recorded (DC, hum, clipped, narrow-band, noisy) before whether
the transcript fits it (language, speaking rate, repetition) before the model-based judgements."""

QUALITY_REASONS: tuple[str, ...] = tuple(rule.reason for rule in RULES)


@dataclass(frozen=True)
class Decision:
    """A product's verdict on one utterance: ``reason`` None keeps it, over ``keep_start_s`` to
    ``keep_end_s`` (seconds into the utterance) when an edge silence was trimmed (both None: whole)."""

    reason: str | None
    detail: str | None
    keep_start_s: float | None = None
    keep_end_s: float | None = None


def trim_span(row: dict, policy: QualityPolicy) -> tuple[float, float] | None:
    """The span left once each edge silence over ``max_edge_silence_s`` is cut down to
    ``edge_silence_margin_s``; None when the product does not trim or no edge is over the limit."""
    limit, duration = policy.max_edge_silence_s, row.get("duration_s")
    leading, trailing = row.get("leading_silence_s"), row.get("trailing_silence_s")
    if not policy.trim_edge_silence or limit is None or duration is None or leading is None or trailing is None:
        return None
    if leading >= duration or (leading <= limit and trailing <= limit):
        return None  # no speech to keep, or nothing to trim
    start = leading - policy.edge_silence_margin_s if leading > limit else 0.0
    end = duration - (trailing - policy.edge_silence_margin_s) if trailing > limit else duration
    return round(start, 3), round(end, 3)


def trimmed_signals(row: dict, span: tuple[float, float], policy: QualityPolicy) -> dict:
    """The signals as the trimmed span would read: its duration, edge silences, and its speech and
    silence shares (the cut edges counted as wholly silent and without speech)."""
    start, end = span
    duration, kept = row["duration_s"], end - start
    removed = duration - kept
    speech_s = row.get("speech_s")
    if speech_s is None and row.get("speech_share") is not None:
        speech_s = row["speech_share"] * duration
    silence = row.get("silence_share")
    return {
        **row,
        "duration_s": kept,
        "leading_silence_s": min(row["leading_silence_s"], policy.edge_silence_margin_s),
        "trailing_silence_s": min(row["trailing_silence_s"], policy.edge_silence_margin_s),
        "speech_share": None if speech_s is None else min(1.0, speech_s / kept),
        "silence_share": None if silence is None else max(0.0, silence * duration - removed) / kept,
    }


def decide_utterance(row: dict, policy: QualityPolicy) -> Decision:
    """The product's :class:`Decision`: where the product trims edge silence, the trimmed span is what
    every other rule judges ("trim before reject"); otherwise long edge silence is its own reason."""
    span = trim_span(row, policy)
    judged = row if span is None else trimmed_signals(row, span, policy)
    verdict = decide(judged, policy)
    if verdict is not None:
        return Decision(*verdict)
    return Decision(None, None, *(span or (None, None)))


def decide(row: dict, policy: QualityPolicy) -> tuple[str, str] | None:
    """``(reason, detail)`` for an utterance that fails the policy, None for one it keeps."""
    failed = []
    for rule in RULES:
        limit = getattr(policy, rule.threshold)
        if limit is None:
            continue
        detail = rule.fails(row, policy, limit)
        if detail is not None:
            failed.append((rule.reason, detail))
    if not failed:
        return None
    reason, detail = failed[0]
    also = "; ".join(f"{r}: {d}" for r, d in failed[1:])
    return reason, detail + (f" (also {also})" if also else "")
