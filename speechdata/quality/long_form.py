"""Quality signals of a recording past the whole-decode budget, measured window by window.

A 2-hour recording is never decoded whole (:class:`~speechdata.audio.streamed.StreamedAudio`): it is
measured in windows of :data:`WINDOW_S`, each exactly as an utterance of its own is measured, and
the windows' signals are combined into the recording's one row: durations and speech add up; levels
combine as energies; ratios, scores and shares are duration-weighted means (the speech SNR
speech-weighted); the bandwidth is the windows' median; the audio language is the one with the most
speech; leading and trailing silence run across windows; the speaker signals come from the window
embeddings of every window together (at most the speaker encoder's cap, spread evenly).

Nothing kept grows with the recording beyond one small row and one count per window: the speaker
signals keep only :data:`~speechdata.quality.speakers.MAX_WINDOWS` window embeddings of the whole
recording, so a first pass counts each window's embeddings (no encoder) and a second embeds only the
windows that hold the kept ones (at most that many windows, read again): the same embeddings as
embedding every window and keeping the spread, at the cost of a dozen windows instead of every one.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import numpy as np

from speechdata.quality.speakers import EMBEDDING_SIZE, MAX_WINDOWS, SpeakerEncoder, SpeakerSignals, speaker_signals
from speechdata.quality.transcript_checks import speaking_rate

WINDOW_S = 10.0
"""Short enough for every model of the stage: SQUIM's MOS attends over its whole input (a 60 s window
asked for 7.2 GB), and about the length of the utterances the signals and thresholds are made for."""

WINDOWS_PER_CALL = 6
"""Windows measured together (batched VAD and models): 60 s of audio held at once. 30 at a time
(300 s) took a run of every shard asset past a 3 GB data-segment cap."""

_WEIGHTED_MEANS = (
    "snr_db",
    "silence_share",
    "mos",
    "dc_offset_ratio",
    "mains_hum_share",
    "dnsmos_sig",
    "dnsmos_bak",
    "dnsmos_ovrl",
)
_WINDOW_SEPARATOR = "#"


def measure_long_recording(
    utt_id: str,
    audio,
    rate: int,
    text: str,
    measure: Callable[[list[tuple[str, np.ndarray, int]], dict[str, dict]], None],
    speakers: SpeakerEncoder | None,
    window_s: float | None = None,
) -> tuple[dict, SpeakerSignals | None]:
    """The recording's audio signals and speaker signals. ``measure(pending, rows)`` measures a list of
    ``(id, samples, rate)`` into ``rows[id]`` (the stage's own per-utterance measurement)."""
    window = int((WINDOW_S if window_s is None else window_s) * rate)
    total = audio.shape[0]
    measured: list[dict] = []
    embedding_counts: list[int] = []
    starts = list(range(0, total, window))
    for group in range(0, len(starts), WINDOWS_PER_CALL):
        pending = [
            (
                f"{utt_id}{_WINDOW_SEPARATOR}{number}",
                np.asarray(audio[start : min(start + window, total)], np.float32),
                rate,
            )
            for number, start in enumerate(starts[group : group + WINDOWS_PER_CALL], start=group)
        ]
        rows: dict[str, dict] = {key: {} for key, _, _ in pending}
        measure(pending, rows)
        measured += [rows[key] for key, _, _ in pending]
        if speakers is not None:
            embedding_counts += [speakers.window_count(samples, rate) for _, samples, _ in pending]
    signals = combine_windows(measured, text)
    if speakers is None:
        return signals, None
    kept: list[np.ndarray] = []
    for number, picks in kept_window_embeddings(embedding_counts).items():
        start = starts[number]
        samples = np.asarray(audio[start : min(start + window, total)], np.float32)
        kept.append(speakers.window_embeddings(samples, rate)[picks])
    windows = np.concatenate(kept) if kept else np.zeros((0, EMBEDDING_SIZE), np.float32)
    return signals, speaker_signals(windows)


def kept_window_embeddings(counts: list[int]) -> dict[int, list[int]]:
    """Which embeddings the speaker signals keep, by window number: of all the windows' embeddings in
    order (``counts[i]`` in window ``i``), every one up to :data:`MAX_WINDOWS`, else that many spread evenly."""
    total = sum(counts)
    chosen = range(total) if total <= MAX_WINDOWS else np.linspace(0, total - 1, MAX_WINDOWS).round().astype(int)
    bounds = np.cumsum([0, *counts])
    picks: dict[int, list[int]] = {}
    for index in (int(i) for i in chosen):
        number = int(np.searchsorted(bounds, index, side="right")) - 1
        picks.setdefault(number, []).append(index - int(bounds[number]))
    return picks


def combine_windows(windows: list[dict], text: str) -> dict:
    """One row of audio signals from the rows of consecutive windows (module docstring)."""
    durations = np.array([w["duration_s"] for w in windows], np.float64)
    duration = float(durations.sum())
    speech_s = float(sum(w["speech_s"] for w in windows))

    def weighted(column: str, weights=durations) -> float | None:
        values = [(w[column], d) for w, d in zip(windows, weights, strict=True) if w.get(column) is not None]
        total = sum(d for _, d in values)
        return float(sum(v * d for v, d in values) / total) if values and total > 0 else None

    energies = [10 ** (w["level_dbfs"] / 10) * d for w, d in zip(windows, durations, strict=True)]
    row = {column: weighted(column) for column in _WEIGHTED_MEANS}
    speech_by_language: Counter = Counter()
    for w in windows:
        if w.get("audio_language") is not None:
            speech_by_language[w["audio_language"]] += w["speech_s"] or 1e-9
    language = speech_by_language.most_common(1)[0][0] if speech_by_language else None
    of_language = [w for w in windows if w.get("audio_language") == language]
    chars_per_s, words_per_s = speaking_rate(text, speech_s)
    row.update(
        has_audio=True,
        duration_s=duration,
        level_dbfs=max(10 * math.log10(sum(energies) / duration), -200.0) if duration and sum(energies) > 0 else -200.0,
        clipped_share=weighted("clipped_share"),
        bandwidth_hz=float(np.median([w["bandwidth_hz"] for w in windows])),
        speech_s=speech_s,
        speech_share=min(1.0, speech_s / duration) if duration > 0 else 0.0,
        leading_silence_s=_silence_run(windows),
        trailing_silence_s=_silence_run(windows[::-1], leading=False),
        audio_language=language,
        audio_language_confidence=float(np.mean([w["audio_language_confidence"] for w in of_language]))
        if of_language and of_language[0].get("audio_language_confidence") is not None
        else None,
        speech_snr_db=weighted("speech_snr_db", [w["speech_s"] for w in windows]),
        chars_per_s=chars_per_s,
        words_per_s=words_per_s,
    )
    return row


def _silence_run(windows: list[dict], leading: bool = True) -> float:
    """Silence before the first (``leading``) or after the last speech, across the windows in order."""
    column = "leading_silence_s" if leading else "trailing_silence_s"
    run = 0.0
    for w in windows:
        if w["speech_s"] > 0:
            return run + w[column]
        run += w["duration_s"]
    return run
