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


@dataclass(frozen=True)
class QualityPolicy:
    """One product's thresholds (units in the names); ``None`` turns a filter off."""

    max_silence_share: float | None = 0.8
    """``mostly_silence``: more than this share of 30 ms frames below -50 dBFS."""
    min_speech_share: float | None = 0.3
    """``no_speech``: Silero VAD finds speech in less than this share of the duration (music, tones, noise)."""
    max_clipped_share: float | None = 0.001
    """``clipped``: more than this share of the source samples at full scale (normalization rejects above 5 %)."""
    min_bandwidth_hz: float | None = 5000.0
    """``narrowband``: effective bandwidth below this (8 kHz telephone audio reads about 4 kHz)."""
    min_snr_db: float | None = 10.0
    """``low_snr``: WADA-SNR estimate below this."""
    min_text_language_confidence: float | None = 0.8
    """``language_mismatch``: the text LID names another language than the landed one with at least this confidence."""
    min_text_language_letters: int = 12
    """Transcripts with fewer letters are never judged by text LID (too short to tell)."""
    max_cer: float | None = 0.3
    """``transcript_mismatch``: the aligner's greedy transcript differs from the landed text by more than this CER."""
    cer_languages: tuple[str, ...] | None = None
    """Languages ``transcript_mismatch`` judges (None: every language): those whose aligner is trained."""
    min_audio_language_confidence: float | None = 0.7
    """``audio_language_mismatch``: the audio LID names another language with at least this confidence."""
    min_mos: float | None = 3.0
    """``low_mos``: the speech-quality model's MOS estimate (1-5) below this."""

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
        return dataclasses.replace(self, max_cer=None, min_audio_language_confidence=None, min_mos=None)

    def with_trained_aligner_only(self, languages: tuple[str, ...], max_cer: float) -> QualityPolicy:
        """``transcript_mismatch`` for ``languages`` at ``max_cer`` (the ``small`` profile's trained
        aligner); the other model filters off (its audio-LID and MOS models are the tiny, random ones)."""
        return dataclasses.replace(
            self, max_cer=max_cer, cer_languages=languages, min_audio_language_confidence=None, min_mos=None
        )


PRESETS: dict[str, QualityPolicy] = {
    "bridge": QualityPolicy(min_snr_db=15.0, max_cer=0.25),
    # Telephone audio is worth training ASR on; the model filters are a little looser.
    "asr": QualityPolicy(min_bandwidth_hz=3000.0, max_cer=0.35, min_mos=2.5),
    "translation": QualityPolicy(),
}
"""The named preset of each product line that applies a quality policy."""

SMALL_PROFILE_MAX_CER = 0.5
"""``transcript_mismatch`` in ``small``, for every product: the small aligner's greedy CER on held-out
speech with the right transcript is 0.2-0.47, with another utterance's transcript 0.7 or more, on
the first half of the audio 0.53 or more (tests/unit/test_transcript_mismatch_small.py)."""

MODEL_FILTER_REASONS = ("transcript_mismatch", "audio_language_mismatch", "low_mos")
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
    Rule("clipped", "max_clipped_share", _above("clipped_share")),
    Rule("narrowband", "min_bandwidth_hz", _below("bandwidth_hz", " Hz")),
    Rule("low_snr", "min_snr_db", _below("snr_db", " dB")),
    Rule("language_mismatch", "min_text_language_confidence", _language_fails("text", min_letters=True)),
    Rule("transcript_mismatch", "max_cer", _cer_fails),
    Rule("audio_language_mismatch", "min_audio_language_confidence", _language_fails("audio", min_letters=False)),
    Rule("low_mos", "min_mos", _below("mos")),
)
"""Every filter, in the order that picks an utterance's reason: what the audio is (silence, not
speech) before how it was recorded (clipped, narrow-band, noisy) before whether the labels fit it."""

QUALITY_REASONS: tuple[str, ...] = tuple(rule.reason for rule in RULES)


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
