"""Decode + resample to 24 kHz mono: soxr against torchaudio, per source sample rate.

Why: every landed utterance goes through ``speechdata.audio.codec.resample``; its default (soxr) was
chosen over torchaudio for speed and stopband rejection. This re-checks both claims on the same
input in the same run, single-threaded (``torch.set_num_threads(1)``), so the figures are
per core:

* throughput: audio seconds per CPU second (``time.process_time``) of decoding an in-memory file
  and resampling it with each method, for each source rate; decoding alone is timed too, since
  it is the part both share. The input is the fixture speech
  (``load_clips()``) concatenated to ``--seconds``, resampled once with soxr to each source rate
  and encoded as FLAC (or WAV) beforehand. The two methods alternate which goes first each repeat
  and each figure is the median pass, so a burst of load on a shared machine skews neither.
* aliasing: the level (dB relative to the input) of a 13 kHz tone after resampling from 32 / 44.1 /
  48 kHz to 24 kHz. 13 kHz lies above the 12 kHz output Nyquist, so whatever is left is alias
  (lower is better). A 10 kHz tone's level (closer to 0 dB is better) shows the passband is kept.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time

import numpy as np
import soundfile as sf
import soxr

from benchmarks.report import emit, progress, ratio, stdout_to_stderr
from speechdata.audio.codec import TARGET_SAMPLE_RATE, read_segment, resample, to_target_mono
from speechdata.testing.shards import load_clips

METHODS = ("soxr", "torchaudio")
SOURCE_RATES = (8_000, 16_000, 22_050, 32_000, 44_100, 48_000)
ALIAS_RATES = (32_000, 44_100, 48_000)
ALIAS_TONE_HZ = 13_000.0
PASSBAND_TONE_HZ = 10_000.0
CONTAINERS = {"flac": ("FLAC", "PCM_16"), "wav": ("WAV", "PCM_16")}


def speech_at_rates(seconds: float, rates: list[int], container: str) -> dict[int, bytes]:
    """``seconds`` of fixture speech, resampled once with soxr to each rate and encoded in memory."""
    clips = load_clips()
    base_rate = clips[0].sample_rate
    speech = np.concatenate([clip.samples for clip in clips])
    n = int(seconds * base_rate)
    speech = np.tile(speech, -(-n // speech.shape[0]))[:n]
    fmt, subtype = CONTAINERS[container]
    files = {}
    for rate in rates:
        samples = speech if rate == base_rate else soxr.resample(speech, base_rate, rate, quality="HQ")
        buffer = io.BytesIO()
        sf.write(buffer, np.clip(samples, -1.0, 1.0), rate, format=fmt, subtype=subtype)
        files[rate] = buffer.getvalue()
    return files


def decode_and_resample(data: bytes, method: str | None) -> np.ndarray:
    """Decode the file and resample it with ``method`` (``None``: decode only, the shared part)."""
    samples, rate = read_segment(io.BytesIO(data))
    if method is None:
        return samples
    return to_target_mono(samples, rate, TARGET_SAMPLE_RATE, method)


def throughput(data: bytes, audio_s: float, repeats: int) -> dict[str | None, float]:
    """Audio seconds per CPU second of decode + resample per method, and of decoding alone.

    Each figure is the median of ``repeats`` passes.
    """
    passes = (*METHODS, None)
    for method in passes:  # first calls build kernels and warm imports; not counted
        decode_and_resample(data, method)
    cpu: dict[str | None, list[float]] = {method: [] for method in passes}
    for repeat in range(repeats):
        for method in passes if repeat % 2 == 0 else reversed(passes):
            started = time.process_time()
            decode_and_resample(data, method)
            cpu[method].append(time.process_time() - started)
    return {method: audio_s / statistics.median(cpu[method]) for method in passes}


def tone_level_db(frequency: float, source_rate: int, method: str, seconds: float = 2.0) -> float:
    """Output level of a sine at ``frequency`` resampled to 24 kHz, in dB relative to the input."""
    t = np.arange(int(seconds * source_rate)) / source_rate
    amplitude = 0.5
    tone = (amplitude * np.sin(2 * np.pi * frequency * t)).astype(np.float32)
    out = resample(tone, source_rate, TARGET_SAMPLE_RATE, method).astype(np.float64)
    steady = out[out.shape[0] // 8 : -out.shape[0] // 8]  # leave out the filters' edge transients
    rms = float(np.sqrt(np.mean(steady**2)))
    return 20.0 * np.log10(max(rms, 1e-12) / (amplitude / np.sqrt(2)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds, for smoke runs")
    parser.add_argument("--seconds", type=float, default=60.0, help="audio seconds per file")
    parser.add_argument("--repeats", type=int, default=25, help="timed passes per rate and method")
    parser.add_argument("--rates", type=int, nargs="+", default=list(SOURCE_RATES))
    parser.add_argument("--container", choices=sorted(CONTAINERS), default="flac")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.repeats = 5.0, 2

    import torch

    torch.set_num_threads(1)
    with stdout_to_stderr():
        files = speech_at_rates(args.seconds, args.rates, args.container)
        speed = {}
        for rate, data in files.items():
            per_method = throughput(data, args.seconds, args.repeats)
            soxr_x, torch_x = per_method["soxr"], per_method["torchaudio"]
            speed[str(rate)] = {
                "soxr_x_realtime": round(soxr_x, 1),
                "torchaudio_x_realtime": round(torch_x, 1),
                "ratio_torchaudio_over_soxr": ratio(torch_x, soxr_x),
                "faster": "soxr" if soxr_x >= torch_x else "torchaudio",
                "decode_only_x_realtime": round(per_method[None], 1),
            }
            progress(f"resample {rate} Hz: {speed[str(rate)]}")
        quality = {}
        for rate in ALIAS_RATES:
            alias = {m: tone_level_db(ALIAS_TONE_HZ, rate, m) for m in METHODS}
            passband = {m: tone_level_db(PASSBAND_TONE_HZ, rate, m) for m in METHODS}
            quality[str(rate)] = {
                "soxr_alias_db": round(alias["soxr"], 1),
                "torchaudio_alias_db": round(alias["torchaudio"], 1),
                "torchaudio_minus_soxr_db": round(alias["torchaudio"] - alias["soxr"], 1),
                "less_aliasing": "soxr" if alias["soxr"] <= alias["torchaudio"] else "torchaudio",
                "soxr_passband_10k_db": round(passband["soxr"], 3) + 0.0,
                "torchaudio_passband_10k_db": round(passband["torchaudio"], 3) + 0.0,
            }

    emit(
        "resample",
        {
            "quick": args.quick,
            "seconds": args.seconds,
            "repeats": args.repeats,
            "container": args.container,
            "target_rate": TARGET_SAMPLE_RATE,
            "torch_threads": 1,
        },
        {
            "x_realtime_per_cpu_by_source_rate": speed,
            f"tone_{int(ALIAS_TONE_HZ)}hz_level_db_by_source_rate": quality,
        },
    )


if __name__ == "__main__":
    main()
