"""Long-form alignment: peak memory and time against the recording's length (1, 10, 30, 120 minutes).

Why: the whole-matrix Viterbi keeps one back-pointer byte per frame and state, so its memory grows
with frames x tokens (a 2-hour recording with its 17 280-word transcript: ~5 GB), and the stage used
to reject such an utterance as ``too_long_to_align``. The checkpointed Viterbi
(``speechdata.alignment.long_form``) keeps ``~4 sqrt(T)`` bytes per state and gives the same path.

Two kinds of point, each in a fresh interpreter (``--measure``), with its peak RSS sampled from
``/proc/self/statm`` every 20 ms (as ``bench_corpus_scale`` does) and its wall time:

* ``viterbi``: ``align_transcript`` on **synthetic log-probs with a known path** (no model): a
  1 024-label vocabulary like parakeet's (1 025 classes with the blank), words of one or two tokens
  (the BPE's ~1.5 per word), 2.4 words a second (17 280 words in 2 hours), each token 1-3 frames
  after a 1-2 frame pause; log-probs = log-softmax of N(0, 1) noise plus 7 on the path's label.
  ``checkpointed`` (the new kernel) against ``whole`` (the whole-matrix kernel, the baseline) where
  its back-pointers fit ``--whole-limit-gb`` (default 2.5: this shared machine's per-process rule),
  with the word boundaries' error against the known path and whether both kernels gave the same words.
  A ``music`` variant inserts a 20 s stretch the transcript does not cover (best label random,
  blank unlikely) in the middle and aligns it with and without the wildcard.
* ``stage``: ``run_alignments`` (the ``alignments`` stage) on a shard whose container holds one
  utterance of that length (24 kHz FLAC, written with the long-form budget) and its transcript, with
  the stage's default wildcard: the audio is streamed in windows from the FLAC, log-probs computed per
  40 s window, aligned, CTMs and tables written. The model is a **synthetic forward** (N(0, 1) logits
  over 1 025 classes per 80 ms frame of each window: no model cost, so the figures are the stage's own
  memory and time), or ``--model PATH`` (a transformers CTC directory, or ``tiny``) for a real one;
  the tiny model on 2 CPUs takes minutes per audio hour, so use it with short ``--minutes``.

``--accuracy-model PATH`` (a trained CTC model: a transformers directory, or ``small`` once the
package ships it) adds word boundary accuracy on the synthesized held-out speech of ``--fixtures``
(16 kHz FLAC and ``heldout.json`` with each word's true start and end, as
``benchmarks/accuracy/bench_alignment_accuracy.py`` writes them): each utterance aligned alone (short),
against all of them joined ``--repeat`` times into one recording (long-form: windows and the
checkpointed Viterbi), and against that recording with 20 s of synthetic music in the middle that
the transcript does not cover, with and without the wildcard (median and p95 error in ms).

``--quick``: 0.5 minutes (the music variant: 1 minute), for the smoke test.

``--pipeline``: the whole pipeline instead. A shard is landed with one ordinary utterance and a
recording of ``--minutes`` of synthesized English speech (the sample clips one after another, 0.4 s
apart, as a 16-bit WAV written clip by clip) with its transcript, and every shard asset of the per-shard
job is materialized with the tiny profile, **one asset per fresh process** in pipeline order (ingest,
alignments, frame grids, quality, near duplicates, features, bridge, ASR FLACs, VAD), each process's
peak RSS (its whole process tree, sampled every 50 ms) and wall time recorded (quality decided without
the looped-phrase filter: :data:`LOOPED_TALK_POLICY`). The first length is
the baseline: every other length's peak per stage is given as a ratio to it (``--minutes 1 120``:
a 2-hour recording against a 1-minute one). ``--whole-decode-s`` lowers the whole-decode budget
for every stage process, so a shorter recording takes the long-form paths. After the shard assets the
two corpus-wide products the recording reaches as its aligned segments are built, each in a fresh
process too: ``asr_manifest`` (``build_and_write_asr_manifests``) and ``hf_dataset`` (the talk's
country, ``refresh_country``; the talk lands with the aligned-JSON fields that make its shard one the
dataset publishes).

``--products``: only what those products read: ingest's index (``raw_shards``), then the talk's word
and segment rows written from its clips' known times (each clip's words spread evenly over it, cut as
the ``alignments`` stage cuts them: no model), then ``asr_flac``, ``asr_manifest`` and ``hf_dataset``.
It measures the products' own memory on long recordings in minutes where the whole pipeline takes
hours on 2 CPUs.

``--whole-path``: ``quality_signals``' whole-decode path alone (an utterance up to the 30-minute
whole-decode budget is decoded whole and measured at once): per length, a fresh process loads the
tiny profile's quality models, builds one utterance of ``--minutes`` of the English sample clips at
24 kHz (the normalized rate) and measures it as the stage measures a chunk (``_measure_chunk``, then
the speaker signals), the process's peak RSS sampled every 20 ms, and every signal and model call's
own peak and the memory it added above the RSS at its start (the samples themselves are held
throughout: 10 minutes of float32 at 24 kHz is 55 MB).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.report import RssSampler, emit, leave_measured, progress, ratio, stdout_to_stderr
from speechdata.testing.long_recordings import ALIGNED_JSON_COLUMNS

ROOT = Path(__file__).resolve().parents[2]
FRAME_S = 0.08
FRAME_MS = 80
WORDS_PER_S = 17_280 / 7200
VOCAB = 1024
LABELS = [chr(0x4E00 + i) for i in range(VOCAB)]
"""One character per label, so that CharVocabulary tokenizes a word into exactly its characters
(no separator: like a BPE, whose pieces carry the word boundary)."""
MUSIC_S = 20.0
SHARD = "longform-000000"


def synthetic_recording(minutes: float, seed: int = 0, music_s: float = 0.0, *, with_log_probs: bool = True):
    """``(log_probs [T, 1025] float32, words, word spans [(first, last)])`` with a known path
    (``with_log_probs=False``: None in their place, for the transcript alone)."""
    rng = np.random.default_rng(seed)
    seconds = minutes * 60
    n_words = max(1, int(round(seconds * WORDS_PER_S)))
    total = int(round(seconds / FRAME_S))
    music_frames = int(round(music_s / FRAME_S))
    labels = np.full(total + music_frames, VOCAB, np.int32)  # blank everywhere, then the words
    words, spans = [], []
    t = 0
    music_at = n_words // 2 if music_frames else -1
    for i in range(n_words):
        if i == music_at:
            labels[t : t + music_frames] = -1
            t += music_frames
        t += int(rng.integers(1, 3))
        tokens = rng.integers(0, VOCAB, int(rng.integers(1, 3)))
        while tokens.size == 2 and tokens[0] == tokens[1]:
            tokens = rng.integers(0, VOCAB, 2)
        first = t
        for token in tokens:
            d = int(rng.integers(1, 4))
            labels[t : t + d] = token
            t += d
        spans.append((first, t))
        words.append("".join(LABELS[k] for k in tokens))
        if t >= labels.size - 4:
            raise ValueError(f"{n_words} words do not fit {minutes} minutes")
    if not with_log_probs:
        return None, words, spans
    log_probs = np.empty((labels.size, VOCAB + 1), np.float32)
    for start in range(0, labels.size, 8192):  # in chunks: float32 throughout, no [T, V] float64
        chunk = rng.standard_normal((min(8192, labels.size - start), VOCAB + 1), dtype=np.float32)
        rows = labels[start : start + chunk.shape[0]]
        spoken = rows >= 0
        chunk[np.flatnonzero(spoken), rows[spoken]] += 7.0
        music = np.flatnonzero(~spoken)
        chunk[music, rng.integers(0, VOCAB, music.size)] += 3.0
        chunk[music, VOCAB] -= 3.0
        chunk -= np.log(np.exp(chunk).sum(axis=1, keepdims=True))
        log_probs[start : start + chunk.shape[0]] = chunk
    return log_probs, words, spans


def _vocabulary():
    from speechdata.alignment.transcript_units import CharVocabulary

    return CharVocabulary(LABELS)


def _measure_viterbi(minutes: float, method: str, music: str) -> dict:
    from speechdata.alignment.forced import WildcardSettings, align_transcript

    log_probs, words, spans = synthetic_recording(minutes, music_s=MUSIC_S if music != "none" else 0.0)
    vocabulary = _vocabulary()
    align_transcript(log_probs[:50], words[0], vocabulary, FRAME_MS, 4000)  # load the kernels first
    wildcard = WildcardSettings() if music == "wildcard" else None
    whole_limit = 10**18 if method == "whole" else 0
    with RssSampler() as rss:
        started, cpu_started = time.perf_counter(), time.process_time()
        result = align_transcript(
            log_probs,
            " ".join(words),
            vocabulary,
            FRAME_MS,
            log_probs.shape[0] * FRAME_MS,
            wildcard=wildcard,
            whole_matrix_frame_tokens=whole_limit,
        )
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    got = np.array([(w.start_ms // FRAME_MS, w.end_ms // FRAME_MS) for w in result.words], np.int64)
    errors = np.abs(got - np.array(spans, np.int64)).ravel()
    return {
        "frames": int(log_probs.shape[0]),
        "words": len(words),
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "rss_before_mb": round(rss._start, 1),
        "peak_rss_mb": round(rss.peak_mb, 1),
        "added_rss_mb": round(rss.added_mb, 1),
        "median_boundary_error_ms": float(np.median(errors)) * FRAME_MS,
        "max_boundary_error_ms": int(errors.max()) * FRAME_MS,
        "untranscribed_ms": [list(s) for s in result.untranscribed],
        "words_digest": hashlib.sha256(got.tobytes()).hexdigest()[:16],
    }


ENGLISH_WORDS = [
    "the",
    "speech",
    "data",
    "platform",
    "aligns",
    "every",
    "word",
    "of",
    "a",
    "long",
    "recording",
    "in",
    "bounded",
    "memory",
]


def build_shard(root: str, minutes: float, english: bool = False) -> dict:
    """One utterance of ``minutes`` of 24 kHz FLAC (tone + noise, encoded in blocks) and its transcript
    (the synthetic labels' words; ``english``: English words at the same rate, for a real model)."""
    import pyarrow as pa
    import soundfile as sf

    from speechdata.audio.budget import MAX_LONG_FORM_SECONDS
    from speechdata.audio.container import (
        AUDIO_CONTAINER_SCHEMA,
        CONTAINER_PARQUET_OPTIONS,
        AudioContainerWriter,
        EncodedUtterance,
    )
    from speechdata.io import layout
    from speechdata.io.storage import DataRoot

    data_root = DataRoot(root)
    rate, n = 24_000, int(minutes * 60 * 24_000)
    rng = np.random.default_rng(1)
    buffer = io.BytesIO()
    with sf.SoundFile(buffer, "w", rate, 1, format="FLAC", subtype="PCM_16") as sound:
        for start in range(0, n, rate * 60):
            k = np.arange(start, min(n, start + rate * 60))
            block = 0.2 * np.sin(2 * np.pi * 220 * k / rate) + 0.02 * rng.standard_normal(k.size)
            sound.write(block.astype(np.float32))
    payload = buffer.getvalue()
    with data_root.parquet_writer(
        layout.normalized_audio(SHARD), AUDIO_CONTAINER_SCHEMA, **CONTAINER_PARQUET_OPTIONS
    ) as parquet:
        container = AudioContainerWriter(parquet, max_utterance_s=MAX_LONG_FORM_SECONDS)
        container.add(EncodedUtterance("recording", rate, n, "flac16", payload))
        container.flush()
    _, words, _ = synthetic_recording(minutes, with_log_probs=False)
    if english:
        words = [ENGLISH_WORDS[i % len(ENGLISH_WORDS)] for i in range(len(words))]
    data_root.write_parquet(
        layout.utterance_index(SHARD),
        pa.table({"utt_id": ["recording"], "text": [" ".join(words)], "language": ["en"]}),
    )
    return {"flac_mb": round(len(payload) / 2**20, 1), "words": len(words)}


def _synthetic_forward(batch: list[np.ndarray]) -> list[np.ndarray]:
    from speechdata.alignment.log_probs import MODEL_SAMPLE_RATE

    out = []
    for audio in batch:
        frames = -(-audio.shape[0] // int(FRAME_S * MODEL_SAMPLE_RATE))
        logits = np.random.default_rng(frames).standard_normal((frames, VOCAB + 1), dtype=np.float32)
        out.append(logits - np.log(np.exp(logits).sum(axis=1, keepdims=True)))
    return out


def _measure_stage(root: str, model: str | None) -> dict:
    from speechdata.alignment.forced import WildcardSettings
    from speechdata.alignment.stage import CtcAligner, run_alignments
    from speechdata.io import layout
    from speechdata.io.storage import DataRoot

    if model is None:
        aligner = CtcAligner("synthetic-ctc", _synthetic_forward, _vocabulary(), FRAME_S)
    else:
        from speechdata.alignment.acoustic_models import load_ctc_model
        from speechdata.alignment.log_probs import ctc_model_forward
        from speechdata.alignment.transcript_units import vocabulary_of

        acoustic = load_ctc_model(model, cache_dir=os.environ.get("SPEECHDATA_MODEL_CACHE", ".cache/models"))
        aligner = CtcAligner(model, ctc_model_forward(acoustic), vocabulary_of(acoustic), acoustic.frame_s)
    data_root = DataRoot(root)
    with RssSampler() as rss:
        started, cpu_started = time.perf_counter(), time.process_time()
        summary = run_alignments(data_root, SHARD, lambda language: aligner, wildcard=WildcardSettings())
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    [scores] = data_root.read_parquet(layout.alignment_scores(SHARD)).to_pylist() or [None]
    return {
        "aligned": scores is not None,
        "rejects": [(r.reason, r.detail[:200]) for r in summary.rejects],
        "n_frames": scores["n_frames"] if scores else None,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "rss_before_mb": round(rss._start, 1),
        "peak_rss_mb": round(rss.peak_mb, 1),
        "added_rss_mb": round(rss.added_mb, 1),
    }


def music_stretch(seconds: float, rate: int, seed: int = 0) -> np.ndarray:
    """Synthetic 'music': chords that change every half second over soft noise bursts, at speech level."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    out = np.zeros(t.size, np.float64)
    for start in range(0, t.size, rate // 2):
        part = slice(start, start + rate // 2)
        for semitones in rng.integers(-12, 13, 3):
            frequency = 220.0 * 2 ** (semitones / 12)
            out[part] += 0.08 * np.sin(2 * np.pi * frequency * t[part]) + 0.03 * np.sin(4 * np.pi * frequency * t[part])
        out[part] += 0.02 * rng.standard_normal(out[part].size) * rng.integers(0, 2)
    return out.astype(np.float32)


def accuracy(model: str, fixtures: Path, repeat: int) -> dict:
    """Word boundary errors of a trained model on synthesized speech with known word times: each
    utterance aligned alone (short) against all of them joined into one recording (long-form: 40 s
    windows and the checkpointed Viterbi), and the recording with a 20 s music stretch in the middle
    that the transcript does not cover, with and without the wildcard."""
    import soundfile as sf

    from speechdata.alignment.acoustic_models import load_ctc_model
    from speechdata.alignment.forced import WildcardSettings, align_transcript
    from speechdata.alignment.log_probs import MODEL_SAMPLE_RATE, LogProbSettings, compute_log_probs, ctc_model_forward
    from speechdata.alignment.transcript_units import vocabulary_of

    acoustic = load_ctc_model(model, cache_dir=os.environ.get("SPEECHDATA_MODEL_CACHE", ".cache/models"))
    forward, vocabulary = ctc_model_forward(acoustic), vocabulary_of(acoustic)
    settings = LogProbSettings(frame_s=acoustic.frame_s)
    frame_ms = int(round(acoustic.frame_s * 1000))
    entries = [e for e in json.loads((fixtures / "heldout.json").read_text()) if e["language"] == "en"]
    audios = []
    for entry in entries:
        samples, rate = sf.read(fixtures / f"{entry['utt_id']}.flac", dtype="float32")
        if rate != MODEL_SAMPLE_RATE:
            raise ValueError(f"{entry['utt_id']}: {rate} Hz, expected {MODEL_SAMPLE_RATE}")
        audios.append(samples)

    def errors_ms(words, truth_s) -> list[float]:
        return [
            abs(got - round(want * 1000))
            for word, (start, end) in zip(words, truth_s, strict=True)
            for got, want in ((word.start_ms, start), (word.end_ms, end))
        ]

    def summary(errors: list[float]) -> dict:
        return {"median_ms": float(np.median(errors)), "p95_ms": float(np.percentile(errors, 95)), "n": len(errors)}

    short = []
    for entry, audio in zip(entries, audios, strict=True):
        [lp] = compute_log_probs(forward, [audio], settings)
        result = align_transcript(
            lp,
            entry["text"],
            vocabulary,
            frame_ms,
            len(audio) * 1000 // MODEL_SAMPLE_RATE,
            emission_offsets_ms=acoustic.emission_offsets_ms,
        )
        short += errors_ms(result.words, entry["word_spans_s"])

    def joined(music_after: int | None):
        pieces, texts, truth, offset = [], [], [], 0.0
        order = [i for _ in range(repeat) for i in range(len(entries))]
        for k, i in enumerate(order):
            pieces.append(audios[i])
            texts.append(entries[i]["text"])
            truth += [(a + offset, b + offset) for a, b in entries[i]["word_spans_s"]]
            offset += len(audios[i]) / MODEL_SAMPLE_RATE
            if k == music_after:
                pieces.append(music_stretch(MUSIC_S, MODEL_SAMPLE_RATE))
                offset += MUSIC_S
        return np.concatenate(pieces), " ".join(texts), truth

    figures = {"model": model, "utterances": len(entries), "short": summary(short)}
    middle = repeat * len(entries) // 2
    for name, music_after, wildcard in (
        ("long", None, None),
        ("long_wildcard", None, WildcardSettings()),
        ("long_music_forced", middle, None),
        ("long_music_wildcard", middle, WildcardSettings()),
    ):
        audio, text, truth = joined(music_after)
        [lp] = compute_log_probs(forward, [audio], settings)
        result = align_transcript(
            lp,
            text,
            vocabulary,
            frame_ms,
            len(audio) * 1000 // MODEL_SAMPLE_RATE,
            wildcard=wildcard,
            whole_matrix_frame_tokens=0,
            emission_offsets_ms=acoustic.emission_offsets_ms,
        )
        figures[name] = {
            **summary(errors_ms(result.words, truth)),
            "seconds": round(len(audio) / MODEL_SAMPLE_RATE, 1),
            "untranscribed_ms": [list(s) for s in result.untranscribed],
        }
    figures["ratio_long_over_short_median"] = ratio(figures["long"]["median_ms"], figures["short"]["median_ms"])
    figures["ratio_music_wildcard_over_long_median"] = ratio(
        figures["long_music_wildcard"]["median_ms"], figures["long"]["median_ms"]
    )
    return figures


PIPELINE_ASSETS = (
    "raw_shards",
    "normalized_audio",
    "alignments",
    "frame_grids",
    "quality_signals",
    "near_duplicates",
    "quality_decisions",
    "qwen_hidden_states",
    "wavlm_features",
    "bridge_tars",
    "shard_manifest",
    "asr_flac",
    "vad_segments",
)
"""The per-shard job's assets, each after those it reads."""
LOOPED_TALK_POLICY = {product: {"disabled": ["transcript_repetition"]} for product in ("bridge", "asr", "translation")}
"""The quality policy the pipeline decides with: the preset, less the looped-phrase filter. The talk
repeats the sample clips' few dozen sentences, so past a minute every trigram of its transcript recurs
and the filter rightly leaves it out of every product (a real recording of that length does not loop);
every other rule, ``too_long`` included, stays."""
PRODUCT_STEPS = ("asr_manifest", "hf_dataset")
"""The corpus-wide products a long recording reaches as its aligned segments, after the shard assets:
the ASR manifests and the talk's country in the Hugging Face dataset."""
PRODUCTS_ONLY_ASSETS = ("raw_shards", "asr_flac")
"""``--products``: the shard assets the products read (the landed file, its index), the alignment's
segment rows written from the talk's known clip times instead of aligned."""
TALK = "talk"
TALK_COUNTRY = "us"


def land_talk(root: str, minutes: float) -> dict:
    """Land the pipeline shard: one ordinary sample utterance and a ``minutes`` recording of the English
    sample clips with its transcript (module docstring)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from speechdata.io import layout
    from speechdata.io.storage import DataRoot
    from speechdata.landing.mark import mark_landed
    from speechdata.testing.long_recordings import write_clip_talk
    from speechdata.testing.shards import build_sample_shard

    data_root = DataRoot(root)
    build_sample_shard(data_root, SHARD, 1, seed=3, long_recordings=0, complete=False)
    talk = write_clip_talk(data_root.path(f"{layout.landing_audio_dir(SHARD)}/{TALK}.wav"), minutes * 60)
    metadata = pq.read_table(data_root.path(layout.landing_metadata(SHARD)))
    # The aligned-JSON fields make the shard one the Hugging Face dataset publishes (the talk's country).
    for name, kind in ALIGNED_JSON_COLUMNS.items():
        metadata = metadata.append_column(name, pa.nulls(metadata.num_rows, kind))
    text = talk.transcript
    row = {**metadata.slice(0, 1).to_pylist()[0], "utt_id": TALK, "audio_path": f"{TALK}.wav"}
    row.update(text=text, language="en", country=TALK_COUNTRY, start_s=None, end_s=None)
    row.update(human_text=text, asr_text=text, cer=0.0, video_id=TALK, transcript_id="t0")
    row.update(transcript_start_idx=0, transcript_end_idx=len(text))
    pq.write_table(
        pa.concat_tables([metadata, pa.Table.from_pylist([row], schema=metadata.schema)]),
        data_root.path(layout.landing_metadata(SHARD)),
    )
    mark_landed(data_root, SHARD)
    return {
        "seconds": round(talk.n_samples / talk.sample_rate, 1),
        "words": len(text.split()),
        "source_rate": talk.sample_rate,
        "timed_words": talk.timed_words(),
    }


def write_known_segments(root: str, landed: dict) -> None:
    """``--products``: the talk's word and segment rows from its clips' known times (each clip's words
    spread evenly over it), as the ``alignments`` stage would write them."""
    from speechdata.io.storage import DataRoot
    from speechdata.testing.long_recordings import write_alignments

    write_alignments(DataRoot(root), SHARD, {TALK: landed["timed_words"]}, {TALK: landed["seconds"]})


def _measure_product_step(root: str, step: str) -> dict:
    """One corpus-wide product over the shard, built in this (fresh) process as its asset builds it."""
    from speechdata.asr.stage import build_and_write_asr_manifests
    from speechdata.hf.country_build import refresh_country
    from speechdata.hf.dataset import DatasetOptions
    from speechdata.hf.filters import SegmentLimits
    from speechdata.io.storage import DataRoot

    data_root = DataRoot(root)
    with TreeRss() as rss:
        started = time.perf_counter()
        if step == "asr_manifest":
            totals = build_and_write_asr_manifests(data_root).totals
            rows = {"train_rows": totals.train_rows, "validation_rows": totals.validation_rows}
        else:
            limits = SegmentLimits(min_duration_s=0.5, max_duration_s=30.0, min_asr_confidence=None)
            build = refresh_country(data_root, TALK_COUNTRY, DatasetOptions(limits=limits)).build
            rows = {
                "rows_written": sum(f.rows for f in build.written),
                "audio_s": round(build.audio_seconds, 1),
                "max_recording_buffer_mb": round(build.max_recording_buffer_bytes / 2**20, 1),
                "errors": len(build.errors),
            }
        wall = time.perf_counter() - started
    return {
        "asset": step,
        "success": True,
        **rows,
        "wall_s": round(wall, 1),
        "rss_before_mb": round(rss.start_mb, 1),
        "peak_rss_mb": round(rss.peak_mb, 1),
    }


class TreeRss:
    """Peak resident memory of this process and its descendants (ingest's workers), sampled every 50 ms."""

    def __init__(self, interval_s: float = 0.05):
        self.interval_s, self.peak_mb, self.start_mb = interval_s, 0.0, 0.0

    @staticmethod
    def resident_mb() -> float:
        page = os.sysconf("SC_PAGE_SIZE")
        parents: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as stat:
                        parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
                except OSError:
                    continue
        tree, grown = {os.getpid()}, True
        while grown:
            more = {pid for pid, parent in parents.items() if parent in tree} - tree
            tree |= more
            grown = bool(more)
        total = 0
        for pid in tree:
            try:
                with open(f"/proc/{pid}/statm") as statm:
                    total += int(statm.read().split()[1]) * page
            except OSError:
                continue
        return total / 2**20

    def __enter__(self):
        import threading

        self.start_mb = self._peak = self.resident_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(self.interval_s):
            self._peak = max(self._peak, self.resident_mb())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak_mb = max(self._peak, self.resident_mb())


def _measure_pipeline_asset(root: str, model_cache_dir: str, asset: str) -> dict:
    """One asset of the landed shard, materialized in this (fresh) process with the tiny resources."""
    import dagster as dg

    from assets import SHARD_ASSETS
    from assets.partitions import shard_partitions
    from tests.tiny_resources import tiny_resources_for

    resources = tiny_resources_for(root, model_cache_dir)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(shard_partitions.name, [SHARD])
        with TreeRss() as rss:
            started = time.perf_counter()
            result = dg.materialize(
                SHARD_ASSETS,
                selection=[asset],
                partition_key=SHARD,
                instance=instance,
                resources=resources,
                raise_on_error=False,
                run_config=({"ops": {asset: {"config": LOOPED_TALK_POLICY}}} if asset == "quality_decisions" else None),
            )
            wall = time.perf_counter() - started
    return {
        "asset": asset,
        "success": result.success,
        "wall_s": round(wall, 1),
        "rss_before_mb": round(rss.start_mb, 1),
        "peak_rss_mb": round(rss.peak_mb, 1),
    }


def pipeline(minutes: list[float], products_only: bool = False) -> dict:
    """Every length through every asset (module docstring), and each stage's peak against the first length's."""
    from speechdata.io import layout
    from speechdata.io.storage import DataRoot

    model_cache_dir = tempfile.mkdtemp(prefix="bench_long_form_models_")
    runs = []
    try:
        for m in minutes:
            workdir = tempfile.mkdtemp(prefix="bench_long_form_pipeline_")
            try:
                landed = land_talk(workdir, m)
                stages = []
                for asset in PRODUCTS_ONLY_ASSETS if products_only else PIPELINE_ASSETS:
                    figures = _child(["pipeline", workdir, model_cache_dir, asset])
                    stages.append(figures)
                    progress(
                        f"{m} min: {asset} {figures['peak_rss_mb']} MB {figures['wall_s']} s ok={figures['success']}"
                    )
                    if products_only and asset == "raw_shards":
                        write_known_segments(workdir, landed)
                for step in PRODUCT_STEPS:
                    figures = _child(["product", workdir, step])
                    stages.append(figures)
                    progress(f"{m} min: {step} {figures['peak_rss_mb']} MB {figures['wall_s']} s")
                del landed["timed_words"]
                data_root = DataRoot(workdir)
                run = {
                    "minutes": m,
                    **landed,
                    "talk_segments_in_asr_flac": _talk_keys(data_root, layout.asr_flac_index),
                }
                if not products_only:
                    keys = data_root.read_parquet(
                        layout.shard_manifest(SHARD), columns=["key", "duration_s"]
                    ).to_pylist()
                    talk = [k for k in keys if k["key"] == TALK or k["key"].startswith(f"{TALK}+")]
                    run["talk_samples_in_bridge"] = len(talk)
                    run["longest_talk_sample_s"] = round(max((k["duration_s"] for k in talk), default=0.0), 1)
                runs.append({**run, "stages": stages})
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
    finally:
        shutil.rmtree(model_cache_dir, ignore_errors=True)
    baseline = {s["asset"]: s for s in runs[0]["stages"]}
    for run in runs[1:]:
        for stage in run["stages"]:
            stage["peak_ratio_over_baseline"] = ratio(stage["peak_rss_mb"], baseline[stage["asset"]]["peak_rss_mb"])
    return {"baseline_minutes": minutes[0], "runs": runs}


WHOLE_PATH_RATE = 24_000
WHOLE_PATH_CALLS = (
    "resample",
    "detect_speech",
    "level_dbfs",
    "effective_bandwidth_hz",
    "wada_snr_db",
    "silence_share",
    "speech_snr_db",
    "dc_offset_ratio",
    "mains_hum_share",
)
"""The stage module's functions profiled one by one on the whole path (``speechdata.quality.stage``)."""


def _measure_whole_path(minutes: float, model_cache_dir: str) -> dict:
    """``quality_signals``' whole path on one utterance of ``minutes`` (module docstring), in this fresh process."""
    import functools

    from speechdata.audio.codec import resample
    from speechdata.quality import stage
    from speechdata.testing.shards import load_clips
    from tests.tiny_resources import tiny_resources_for

    calls: dict[str, dict] = {}

    def profiled(name: str, function):
        @functools.wraps(function)
        def call(*args, **kwargs):
            with RssSampler() as rss:
                started = time.perf_counter()
                result = function(*args, **kwargs)
            calls[name] = {
                "added_mb": round(rss.added_mb, 1),
                "peak_mb": round(rss.peak_mb, 1),
                "wall_s": round(time.perf_counter() - started, 2),
            }
            return result

        return call

    workdir = tempfile.mkdtemp(prefix="bench_long_form_whole_")
    try:
        resources = tiny_resources_for(workdir, model_cache_dir)
        device, models = resources["torch_device"], resources["quality_models"]
        vad = resources["vad"]
        vad_model = vad.model()
        audio_language, speech_quality = models.audio_language(device), models.speech_quality(device)
        dnsmos, speakers = models.dnsmos(), models.speaker_encoder(device)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    english = [c for c in load_clips() if c.language == "en" and c.samples.ndim == 1]
    pieces, frames, texts = [], 0, []
    gap = np.zeros(int(0.4 * WHOLE_PATH_RATE), np.float32)
    while frames < minutes * 60 * WHOLE_PATH_RATE:
        clip = english[len(texts) % len(english)]
        voice = resample(np.asarray(clip.samples, np.float32), clip.sample_rate, WHOLE_PATH_RATE)
        pieces += [gap, voice]
        frames += gap.size + voice.size
        texts.append(clip.text)
    samples = np.concatenate(pieces)
    del pieces
    for name in WHOLE_PATH_CALLS:
        setattr(stage, name, profiled(name, getattr(stage, name)))
    audio_language.identify = profiled("audio_language", audio_language.identify)
    speech_quality.mos = profiled("mos", speech_quality.mos)
    dnsmos.score = profiled("dnsmos", dnsmos.score)
    speakers.signals_many = profiled("speakers", speakers.signals_many)
    pending = [("talk", samples, WHOLE_PATH_RATE)]
    rows: dict[str, dict] = {"talk": {}}
    with RssSampler() as whole:
        started = time.perf_counter()
        audios_16k = stage._measure_chunk(
            pending,
            rows,
            {"talk": " ".join(texts)},
            {"talk": 0.0},  # the container's clipping, as the stage reads it
            vad_model,
            vad.params(),
            audio_language,
            speech_quality,
            dnsmos,
        )
        evidence: dict = {}
        stage._measure_speakers(pending, audios_16k, speakers, evidence)
        wall = time.perf_counter() - started
    return {
        "minutes": minutes,
        "seconds": round(samples.size / WHOLE_PATH_RATE, 1),
        "samples_mb": round(samples.nbytes / 2**20, 1),
        "rss_before_mb": round(whole.peak_mb - whole.added_mb, 1),
        "peak_rss_mb": round(whole.peak_mb, 1),
        "wall_s": round(wall, 1),
        "calls": calls,
        "signals": {k: rows["talk"][k] for k in ("level_dbfs", "snr_db", "silence_share", "dc_offset_ratio")},
    }


def whole_path(minutes: list[float]) -> dict:
    """Each length's whole-path profile in a fresh process; peaks against the first length's."""
    model_cache_dir = tempfile.mkdtemp(prefix="bench_long_form_models_")
    try:
        points = []
        for m in minutes:
            point = _child(["whole_path", m, model_cache_dir])
            progress(
                f"{m} min: whole path {point['peak_rss_mb']} MB {point['wall_s']} s; "
                + ", ".join(f"{k} +{v['added_mb']} MB" for k, v in point["calls"].items())
            )
            points.append(point)
    finally:
        shutil.rmtree(model_cache_dir, ignore_errors=True)
    for point in points[1:]:
        point["peak_ratio_over_baseline"] = ratio(point["peak_rss_mb"], points[0]["peak_rss_mb"])
    return {"baseline_minutes": minutes[0], "points": points}


def _talk_keys(data_root, output) -> int:
    keys = data_root.read_parquet(output(SHARD), columns=["utt_id"])["utt_id"].to_pylist()
    return sum(1 for key in keys if key.startswith(f"{TALK}+"))


def _child(arguments: list[str]) -> dict:
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.accuracy.bench_long_form", "--measure", json.dumps(arguments)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        # the pipeline's assets record the models of the profile they are imported under
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            **({"SPEECHDATA_PROFILE": "tiny"} if arguments[0] in ("pipeline", "whole_path") else {}),
        },
    )
    if completed.returncode != 0:
        raise RuntimeError(f"{arguments}: {completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def _whole_matrix_bytes(minutes: float) -> int:
    frames = int(round(minutes * 60 / FRAME_S))
    tokens = int(round(minutes * 60 * WORDS_PER_S * 1.5))
    return frames * (2 * tokens + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, nargs="+", default=[1, 10, 30, 120])
    parser.add_argument("--quick", action="store_true", help="0.5 minutes (music: 1 minute)")
    parser.add_argument("--whole-limit-gb", type=float, default=2.5, help="run the whole-matrix baseline up to this")
    parser.add_argument("--music-minutes", type=float, default=10.0, help="length of the 20 s music variant")
    parser.add_argument("--model", help="a CTC model (transformers directory, or tiny) for the stage points")
    parser.add_argument("--no-stage", action="store_true", help="the Viterbi points only")
    parser.add_argument(
        "--accuracy-model",
        help="also measure word boundary accuracy with this trained CTC model (transformers directory, or small)",
    )
    parser.add_argument("--fixtures", type=Path, default=ROOT / "tests" / "fixtures" / "synthesized_speech")
    parser.add_argument("--repeat", type=int, default=3, help="accuracy: times the held-out set is joined")
    parser.add_argument("--pipeline", action="store_true", help="every shard asset, one per process (docstring)")
    parser.add_argument(
        "--products",
        action="store_true",
        help="pipeline: only ingest's index, the ASR FLACs and the two products, on known segments (docstring)",
    )
    parser.add_argument(
        "--whole-decode-s",
        type=float,
        help="pipeline: the whole-decode budget (SPEECHDATA_MAX_UTTERANCE_SECONDS) for every stage process",
    )
    parser.add_argument(
        "--whole-path", action="store_true", help="quality_signals' whole-decode path alone, per length (docstring)"
    )
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure is not None:
        kind, *rest = json.loads(args.measure)
        measure = {
            "viterbi": _measure_viterbi,
            "stage": _measure_stage,
            "pipeline": _measure_pipeline_asset,
            "product": _measure_product_step,
            "whole_path": _measure_whole_path,
        }[kind]
        with stdout_to_stderr():
            figures = measure(*rest)
        print(json.dumps(figures))
        leave_measured()
    if args.whole_path:
        with stdout_to_stderr():
            figures = whole_path(args.minutes)
        emit(
            "long_form_quality_whole_path",
            {"minutes": args.minutes, "profile": "tiny", "rate": WHOLE_PATH_RATE},
            figures,
        )
        return
    if args.pipeline or args.products:
        if args.whole_decode_s is not None:  # read by the stage processes, which inherit it
            os.environ["SPEECHDATA_MAX_UTTERANCE_SECONDS"] = str(args.whole_decode_s)
        minutes = [0.5, 1.0] if args.quick else args.minutes
        with stdout_to_stderr():
            figures = pipeline(minutes, products_only=args.products)
        whole_decode_s = args.whole_decode_s or 1800.0
        emit(
            "long_form_products" if args.products else "long_form_pipeline",
            {"minutes": minutes, "profile": "tiny", "per_process": "one asset", "whole_decode_s": whole_decode_s},
            figures,
        )
        return
    minutes = [0.5] if args.quick else args.minutes
    music_minutes = 1.0 if args.quick else args.music_minutes
    points = []
    with stdout_to_stderr():
        for m in minutes:
            point: dict = {"minutes": m, "whole_matrix_backpointer_mb": round(_whole_matrix_bytes(m) / 2**20, 1)}
            point["checkpointed"] = _child(["viterbi", m, "checkpointed", "none"])
            if _whole_matrix_bytes(m) <= args.whole_limit_gb * 2**30:
                whole = _child(["viterbi", m, "whole", "none"])
                point["whole"] = whole
                point["same_words"] = whole["words_digest"] == point["checkpointed"]["words_digest"]
                point["ratio_peak_rss_over_whole"] = ratio(point["checkpointed"]["peak_rss_mb"], whole["peak_rss_mb"])
                point["ratio_added_rss_over_whole"] = ratio(
                    point["checkpointed"]["added_rss_mb"], whole["added_rss_mb"]
                )
                point["ratio_wall_over_whole"] = ratio(point["checkpointed"]["wall_s"], whole["wall_s"])
                point["ratio_cpu_over_whole"] = ratio(point["checkpointed"]["cpu_s"], whole["cpu_s"])
            else:
                point["whole"] = f"not run: {_whole_matrix_bytes(m) / 2**30:.1f} GB of back-pointers"
            if not args.no_stage:
                workdir = tempfile.mkdtemp(prefix="bench_long_form_")
                try:
                    point["stage"] = {
                        **build_shard(workdir, m, english=args.model is not None),
                        **_child(["stage", workdir, args.model]),
                    }
                finally:
                    shutil.rmtree(workdir, ignore_errors=True)
            progress(
                f"{m} min: checkpointed {point['checkpointed']['peak_rss_mb']} MB "
                f"{point['checkpointed']['wall_s']} s; whole {point.get('whole')!s:.80}; "
                f"stage {point.get('stage', {}).get('peak_rss_mb')} MB {point.get('stage', {}).get('wall_s')} s"
            )
            points.append(point)
        music = {
            variant: _child(["viterbi", music_minutes, "checkpointed", variant]) for variant in ("forced", "wildcard")
        }
        clean = _child(["viterbi", music_minutes, "checkpointed", "none"])
        accuracy_figures = None
        if args.accuracy_model:
            accuracy_figures = accuracy(args.accuracy_model, args.fixtures, args.repeat)
    emit(
        "long_form",
        {
            "minutes": minutes,
            "words_per_s": round(WORDS_PER_S, 3),
            "frame_s": FRAME_S,
            "classes": VOCAB + 1,
            "viterbi_points": "synthetic log-probs with a known path",
            "stage_model": args.model or "synthetic forward (N(0,1) logits)",
        },
        {
            "points": points,
            "music_20s": {
                "minutes": music_minutes,
                "clean_median_boundary_error_ms": clean["median_boundary_error_ms"],
                "forced_median_boundary_error_ms": music["forced"]["median_boundary_error_ms"],
                "forced_max_boundary_error_ms": music["forced"]["max_boundary_error_ms"],
                "wildcard_median_boundary_error_ms": music["wildcard"]["median_boundary_error_ms"],
                "wildcard_max_boundary_error_ms": music["wildcard"]["max_boundary_error_ms"],
                "wildcard_untranscribed_ms": music["wildcard"]["untranscribed_ms"],
            },
            "accuracy": accuracy_figures or "not run: pass --accuracy-model PATH (a trained CTC model)",
        },
    )


if __name__ == "__main__":
    main()
