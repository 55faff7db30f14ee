"""The quality-signals step of one shard and the near-duplicate signals after it, per audio hour.

Why: Resemblyzer's speaker encoder (a float64 LSTM on the CPU) dominated ``quality_signals``: it ran
once per utterance over at most 12 windows, and ``near_duplicates`` embedded the same audio again.
Now the windows of a whole chunk of utterances go through the encoder together
(:data:`speechdata.quality.speakers.BATCH_WINDOWS` at a time), the quality stage hands the encoder
the 16 kHz audio it already resampled, and the encoder remembers each utterance's window embeddings
by a digest of its audio, so the near-duplicate signals of a shard measured in the same process
embed nothing again.

On the sample shard (``--utterances`` sample utterances plus ``--long`` long recordings, normalized
through ingest), with the tiny profile's models (tiny audio LID and SQUIM twins, the real DNSMOS and
the real speaker encoder), this reports in wall seconds per audio hour (the median of ``--repeats``
passes, old and new in turn; ``--torch-threads``, torch's default unless set):

* ``quality_signals`` with the old speaker path (one encoder forward per utterance, audio resampled
  again, nothing remembered) against the new one, and the speaker part of each alone;
* the near-duplicate signals (``shard_signals``) with the encoder's memory empty (the old cost, and
  the cost where ``near_duplicates`` runs first or in another process) against after the quality step;
* whether the two ``quality.parquet`` files are the same bytes (expected: true), and whether the
  near-duplicate signals are equal.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

from benchmarks.report import emit, progress, ratio, stdout_to_stderr, timed_call
from speechdata.audio.codec import resample
from speechdata.audio.container import iter_container_audio
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.ingest import run_normalized_audio, run_raw_shards
from speechdata.quality.audio_models import AudioClassifierLanguageId, SquimObjectiveMos
from speechdata.quality.dnsmos import Dnsmos
from speechdata.quality.near_duplicates import shard_signals
from speechdata.quality.paths import quality_signals
from speechdata.quality.speakers import EMBEDDING_SIZE, ENCODER_SAMPLE_RATE, SpeakerEncoder, shipped_speaker_encoder
from speechdata.quality.speakers import speaker_signals as signals_of_windows
from speechdata.quality.stage import run_quality_signals
from speechdata.testing.shards import build_sample_shard
from speechdata.vad.silero import load_silero_model

SHARD = "bench-quality"


class PerUtteranceEncoder:
    """The old speaker path: one encoder forward per utterance over its own windows, nothing remembered."""

    def __init__(self, encoder: SpeakerEncoder):
        self.encoder = encoder

    def window_embeddings(self, samples: np.ndarray, sample_rate: int) -> np.ndarray:
        wav = resample(np.asarray(samples, np.float32), sample_rate, ENCODER_SAMPLE_RATE)
        mels = self.encoder._window_mels(wav)
        return np.zeros((0, EMBEDDING_SIZE), np.float32) if mels is None else self.encoder._embed(list(mels))

    def signals_many(self, audios):
        return [signals_of_windows(self.window_embeddings(samples, rate)) for samples, rate in audios]


def build_shard(root: DataRoot, utterances: int, long_recordings: int, seed: int) -> None:
    build_sample_shard(root, SHARD, utterances, seed=seed, long_recordings=long_recordings, formats=("flac",))
    run_raw_shards(root, SHARD)
    run_normalized_audio(root, SHARD)


def tiny_models() -> dict:
    from resources.quality import tiny_audio_language_model, tiny_squim_objective_model

    model, extractor = tiny_audio_language_model()
    return {
        "vad_model": load_silero_model(),
        "audio_language": AudioClassifierLanguageId(model, extractor, "cpu"),
        "speech_quality": SquimObjectiveMos(tiny_squim_objective_model(), "cpu"),
        "dnsmos": Dnsmos(threads=1),
    }


def measure(utterances: int, long_recordings: int, repeats: int, seed: int, torch_threads: int) -> dict:
    if torch_threads:
        torch.set_num_threads(torch_threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = DataRoot(f"{tmp}/data")
        build_shard(root, utterances, long_recordings, seed)
        models = tiny_models()
        encoder = shipped_speaker_encoder()
        old_encoder = PerUtteranceEncoder(encoder)
        audios = list(_audios(root))  # for the speaker part alone, on the same audio

        def old_step() -> bytes:
            run_quality_signals(root, SHARD, speakers=old_encoder, **models)
            return Path(root.path(quality_signals(SHARD))).read_bytes()

        def new_step() -> bytes:
            encoder.forget()
            run_quality_signals(root, SHARD, speakers=encoder, **models)
            return Path(root.path(quality_signals(SHARD))).read_bytes()

        encoder.forget()
        audio_s = run_quality_signals(root, SHARD, speakers=encoder, **models).audio_seconds  # warm-up
        passes: dict[str, list[float]] = {"old": [], "new": [], "old_speakers": [], "new_speakers": []}
        passes |= {"nd_cold": [], "nd_after_quality": []}
        for repeat in range(repeats):
            for which in ("old", "new") if repeat % 2 == 0 else ("new", "old"):
                seconds, written = timed_call(old_step if which == "old" else new_step)
                passes[which].append(seconds)
                if which == "old":
                    old_bytes = written
                else:
                    new_bytes = written
                    # The quality step filled the encoder's memory: the near-duplicate signals find it.
                    seconds, after_quality = timed_call(lambda: shard_signals(root, SHARD)[0])
                    passes["nd_after_quality"].append(seconds)
                    encoder.forget()
                    seconds, cold = timed_call(lambda: shard_signals(root, SHARD)[0])
                    passes["nd_cold"].append(seconds)
            passes["old_speakers"].append(timed_call(lambda: old_encoder.signals_many(audios))[0])
            encoder.forget()
            passes["new_speakers"].append(timed_call(lambda: encoder.signals_many(audios))[0])
        medians = {key: float(np.median(values)) for key, values in passes.items()}
        hours = audio_s / 3600
        per_hour = {key: round(value / hours, 1) for key, value in medians.items()}
        progress(f"{audio_s:.0f} s of audio; seconds per audio hour: {per_hour}")
        return {
            "audio_seconds": round(audio_s, 1),
            "quality_signals_s_per_audio_hour_old": per_hour["old"],
            "quality_signals_s_per_audio_hour_new": per_hour["new"],
            "quality_signals_speedup": ratio(medians["old"], medians["new"]),
            "speakers_s_per_audio_hour_old": per_hour["old_speakers"],
            "speakers_s_per_audio_hour_new": per_hour["new_speakers"],
            "speakers_speedup": ratio(medians["old_speakers"], medians["new_speakers"]),
            "near_dup_signals_s_per_audio_hour_cold": per_hour["nd_cold"],
            "near_dup_signals_s_per_audio_hour_after_quality": per_hour["nd_after_quality"],
            "near_dup_signals_speedup": ratio(medians["nd_cold"], medians["nd_after_quality"]),
            "quality_parquet_identical": old_bytes == new_bytes,
            "near_dup_signals_equal": _same_signals(cold, after_quality),
        }


def _audios(root: DataRoot):
    for _, samples, rate in iter_container_audio(root, layout.normalized_audio(SHARD)):
        yield resample(samples, rate, ENCODER_SAMPLE_RATE), ENCODER_SAMPLE_RATE


def _same_signals(first, second) -> bool:
    def key(signals):
        embedding = signals.speaker_embedding
        return (signals.utt_id, signals.exact_hash, None if embedding is None else embedding.tobytes())

    return [key(s) for s in first] == [key(s) for s in second]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--utterances", type=int, default=8)
    parser.add_argument("--long", type=int, default=1, help="long recordings in the sample shard")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch-threads", type=int, default=0, help="0: torch's default, as the stage runs")
    args = parser.parse_args()
    with stdout_to_stderr():
        figures = measure(args.utterances, args.long, args.repeats, args.seed, args.torch_threads)
    emit("quality_signals", vars(args), figures)


if __name__ == "__main__":
    main()
