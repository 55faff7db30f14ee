"""Build an aligned-JSON corpus (per-country aligned JSONs over long recordings) from the sample clips.

Each recording strings segments of one to three clips of the country's language together with
silence between them and is written as Ogg/Opus (48 kHz, like the corpus's ``.opus`` files) or FLAC.
Each recording gets one ``<video_id>_<transcript_id>_aligned.json`` whose segments carry the human
transcript, an ASR transcript with one word dropped now and then, and the CER between them. Every
recording also holds one segment shorter than 3 s, so duration filtering has work to do.
Seeded: the same arguments give the same corpus.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import jiwer
import numpy as np
import soundfile as sf
import soxr

from speechdata.importers.aligned_json import ALIGNMENT_SUBDIR, language_for_country
from speechdata.testing.shards import Clip, load_clips

SAMPLE_COUNTRIES = {"de": 3, "fr": 3}


def build_aligned_json_corpus(
    countries_dir: str | Path,
    recordings: dict[str, int] = SAMPLE_COUNTRIES,
    *,
    seed: int = 0,
    segments_per_recording: int = 3,
    audio_format: str = "opus",
    clips: list[Clip] | None = None,
    first_recording: int = 0,
) -> list[Path]:
    """Write ``<countries_dir>/<country>/...`` for ``recordings`` (country -> count); returns the JSONs.

    ``first_recording`` offsets the video ids, so a later call adds new recordings to a corpus.
    """
    rng = np.random.default_rng(seed + first_recording)
    clips = clips or load_clips()
    written = []
    for country, count in recordings.items():
        language = language_for_country(country)
        pool = [c for c in clips if c.language == language]
        if not pool:
            raise ValueError(f"no sample clips in {language!r} for {country!r}")
        for r in range(first_recording, first_recording + count):
            video_id = f"vid{country[:2]}{r:04d}"
            written.append(
                _write_recording(
                    Path(countries_dir) / country, video_id, pool, rng, segments_per_recording, audio_format
                )
            )
    return written


def _write_recording(
    country_dir: Path, video_id: str, pool: list[Clip], rng, n_segments: int, audio_format: str
) -> Path:
    rate = 48_000 if audio_format == "opus" else 16_000
    pieces, segments, position, transcript = [], [], 0.0, ""
    for k in range(n_segments + 1):
        # The last segment is a single short piece of a clip: it must be filtered as too short.
        short = k == n_segments
        picked = [pool[int(j)] for j in rng.choice(len(pool), 1 if short else int(rng.integers(1, 4)))]
        gap = np.zeros(int(rng.uniform(0.4, 1.2) * rate), np.float32)
        audio = np.concatenate([soxr.resample(c.samples, c.sample_rate, rate).astype(np.float32) for c in picked])
        if short:
            audio = audio[: int(1.5 * rate)]
        pieces += [gap, audio]
        start = position + len(gap) / rate
        end = start + len(audio) / rate
        position = end
        human = " ".join(c.text for c in picked)
        words = human.split()
        if len(words) > 3 and rng.random() < 0.5:
            del words[int(rng.integers(len(words)))]
        asr = " ".join(words)
        transcript = _append_segment(segments, transcript, start, end, human, asr)
    return _write_files(country_dir, video_id, pieces, segments, rate, audio_format)


def build_aligned_json_from_clips(
    countries_dir: str | Path,
    recordings: dict[str, list[list[Clip]]],
    *,
    seed: int = 0,
    audio_format: str = "opus",
) -> list[Path]:
    """Write ``<countries_dir>/<country>/...`` with one recording per list of clips, one segment per clip.

    Nothing is drawn from a pool: a clip passed once is spoken once in the corpus. A clip shorter than
    2 s is meant as a ``too_short`` segment. The ASR transcript is the human one, lightly perturbed
    (one word dropped or one letter changed in every other segment); ``cer`` is jiwer's CER between them.
    """
    rng = np.random.default_rng(seed)
    rate = 48_000 if audio_format == "opus" else 16_000
    written = []
    for country, clip_lists in recordings.items():
        for r, clips in enumerate(clip_lists):
            pieces, segments, position, transcript = [], [], 0.0, ""
            for k, clip in enumerate(clips):
                gap = np.zeros(int(rng.uniform(0.4, 1.2) * rate), np.float32)
                audio = soxr.resample(clip.samples, clip.sample_rate, rate).astype(np.float32)
                pieces += [gap, audio]
                start = position + len(gap) / rate
                end = start + len(audio) / rate
                position = end
                human = clip.text
                asr = _perturbed(human, rng) if k % 2 else human
                transcript = _append_segment(segments, transcript, start, end, human, asr)
            written.append(
                _write_files(
                    Path(countries_dir) / country, f"vid{country[:2]}{r:04d}", pieces, segments, rate, audio_format
                )
            )
    return written


def _perturbed(text: str, rng: np.random.Generator) -> str:
    """What an ASR model might have heard: one word dropped, or one letter of a word changed."""
    words = text.split()
    i = int(rng.integers(len(words)))
    if len(words) > 3 and rng.random() < 0.5:
        del words[i]
    else:
        word = words[i]
        j = int(rng.integers(len(word)))
        words[i] = word[:j] + ("e" if word[j] != "e" else "a") + word[j + 1 :]
    return " ".join(words)


def _write_files(
    country_dir: Path, video_id: str, pieces: list[np.ndarray], segments: list[dict], rate: int, audio_format: str
) -> Path:
    pieces.append(np.zeros(int(0.5 * rate), np.float32))
    audio_dir = country_dir / "audio"
    audio_dir.mkdir(parents=True, exist_ok=True)
    audio_file = audio_dir / f"{video_id}.{audio_format}"
    buffer = io.BytesIO()
    if audio_format == "opus":
        sf.write(buffer, np.concatenate(pieces), rate, format="OGG", subtype="OPUS")
    else:
        sf.write(buffer, np.concatenate(pieces), rate, format="FLAC", subtype="PCM_16")
    audio_file.write_bytes(buffer.getvalue())
    json_dir = country_dir / ALIGNMENT_SUBDIR
    json_dir.mkdir(parents=True, exist_ok=True)
    json_path = json_dir / f"{video_id}_t1_aligned.json"
    # Relative to the country folder, as a corpus moved between machines would have it.
    json_path.write_text(json.dumps({"audio_file": f"audio/{audio_file.name}", "segments": segments}, indent=1))
    return json_path


def _append_segment(segments: list[dict], transcript: str, start: float, end: float, human: str, asr: str) -> str:
    """Append one aligned-JSON segment (its ``cer`` computed with jiwer, its character span in the
    recording's transcript) and return the transcript with ``human`` joined on."""
    start_idx = len(transcript) + (1 if transcript else 0)
    segments.append(
        {
            "start": round(start, 3),
            "end": round(end, 3),
            "asr_text": asr,
            "human_text": human,
            "cer": round(float(jiwer.cer(human, asr)), 4),
            "start_idx": start_idx,
            "end_idx": start_idx + len(human),
        }
    )
    return f"{transcript} {human}" if transcript else human
