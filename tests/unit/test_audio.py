import io

import numpy as np
import pytest
import soundfile as sf

from speechdata.audio.codec import downmix_to_mono, encode_flac, resample, resampled_length
from tests.conftest import tone


def level_db(samples: np.ndarray) -> float:
    core = samples[2400:-2400]
    return 20 * np.log10(np.sqrt(np.mean(core**2)) / np.sqrt(0.5 * 0.25) + 1e-12)


@pytest.mark.parametrize("method", ["soxr", "torchaudio"])
@pytest.mark.parametrize("rate", [8_000, 16_000, 22_050, 32_000, 44_100, 48_000])
def test_resample_gives_the_documented_length_and_keeps_a_passband_tone(method, rate):
    x = tone(1.7, rate, freq=1000)
    y = resample(x, rate, 24_000, method)
    assert y.dtype == np.float32
    assert y.shape[0] == resampled_length(x.shape[0], rate, 24_000)
    assert abs(level_db(y)) < 0.1


@pytest.mark.parametrize("method", ["soxr", "torchaudio"])
@pytest.mark.parametrize("rate", [32_000, 44_100, 48_000])
def test_resample_suppresses_content_above_the_new_nyquist(method, rate):
    aliased = resample(tone(2.0, rate, freq=13_000), rate, 24_000, method)
    assert level_db(aliased) < -75


def test_same_rate_is_a_no_op():
    x = tone(0.5, 24_000)
    assert resample(x, 24_000, 24_000) is x or np.array_equal(resample(x, 24_000, 24_000), x)


def test_unknown_resampler_is_an_error():
    with pytest.raises(ValueError, match="unknown resampler"):
        resample(tone(0.1, 16_000), 16_000, 24_000, "linear")


def test_downmix_averages_channels():
    stereo = np.array([[1.0, 0.0], [0.5, 0.5]], dtype=np.float32)
    assert downmix_to_mono(stereo).tolist() == [0.5, 0.5]
    assert downmix_to_mono(stereo[:, :1]).tolist() == [1.0, 0.5]


def test_flac_encoding_clips_instead_of_wrapping():
    loud = np.array([1.5, -1.5, 0.25], dtype=np.float32)
    decoded, rate = sf.read(io.BytesIO(encode_flac(loud, 24_000)), dtype="float32")
    assert rate == 24_000
    assert decoded[0] == pytest.approx(1.0, abs=1e-4) and decoded[1] == pytest.approx(-1.0, abs=1e-4)
    assert decoded[2] == pytest.approx(0.25, abs=1e-4)


@pytest.mark.parametrize("codec, tolerance", [("flac16", 1 / 32767), ("flac24", 1e-6), ("pcm16", 1 / 32767)])
def test_every_codec_round_trips_within_its_quantization_step(codec, tolerance):
    from speechdata.audio.codec import decode_audio, encode_audio

    x = tone(0.3, 24_000, freq=523.0)
    y = decode_audio(encode_audio(x, 24_000, codec), codec)
    assert y.dtype == np.float32 and y.shape == x.shape
    assert np.max(np.abs(y - x)) <= tolerance


def test_pcm16_clips_instead_of_wrapping():
    from speechdata.audio.codec import decode_audio, decode_pcm16, encode_audio

    data = encode_audio(np.array([2.0, -2.0], np.float32), 24_000, "pcm16")
    assert decode_pcm16(data, "pcm16").tolist() == [32767, -32767]
    assert decode_audio(data, "pcm16").tolist() == [32767 / 32768, -32767 / 32768]


def test_flac16_and_pcm16_store_the_same_integers_and_decode_to_the_same_floats():
    """Every product made from stored audio is the same whichever 16-bit codec stored it."""
    from speechdata.audio.codec import decode_audio, decode_pcm16, encode_audio

    rng = np.random.default_rng(3)
    x = np.concatenate([rng.uniform(-1.3, 1.3, 48_000), [1.0, -1.0, 0.5, -0.5, 0.0]]).astype(np.float32)
    flac, pcm = encode_audio(x, 24_000, "flac16"), encode_audio(x, 24_000, "pcm16")
    ints = decode_pcm16(pcm, "pcm16")
    assert ints.dtype == np.dtype("<i2") and np.array_equal(decode_pcm16(flac, "flac16"), ints)
    assert np.abs(ints.astype(np.int32)).max() == 32767 and (np.abs(ints.astype(np.int32)) > 16384).any()
    floats = decode_audio(pcm, "pcm16")
    assert floats.tobytes() == decode_audio(flac, "flac16").tobytes()
    # libsndfile's convention, so soundfile reading a stored FLAC or a tar's WAV gives the same floats
    assert np.array_equal(floats, ints.astype(np.float32) / 32768)
    with pytest.raises(ValueError, match="flac24.*16-bit"):
        decode_pcm16(encode_audio(x, 24_000, "flac24"), "flac24")


def test_unknown_codec_is_an_error():
    from speechdata.audio.codec import encode_audio

    with pytest.raises(ValueError, match="unknown audio codec"):
        encode_audio(tone(0.1, 24_000), 24_000, "mp3")


def test_downmix_of_many_channels_is_their_mean():
    x = np.random.default_rng(0).standard_normal((1000, 6)).astype(np.float32)
    assert np.allclose(downmix_to_mono(x), x.mean(axis=1), atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pcm16_quantization_is_rint_of_the_clipped_samples_times_32767(dtype):
    from speechdata.audio.codec import encode_audio, encode_audio_payload, quantize_pcm16

    rng = np.random.default_rng(7)
    # Beyond full scale, exactly at it, and on the half steps where rint's ties-to-even decides.
    edges = [1.0, -1.0, 1.5, -3.0, 0.5 / 32767, -0.5 / 32767, 1.5 / 32767, 32766.5 / 32767, -32766.5 / 32767]
    x = np.concatenate([np.array(edges), rng.uniform(-1.2, 1.2, 200_000)]).astype(dtype)
    reference = np.rint(np.clip(x, -1.0, 1.0) * 32767.0).astype("<i2")
    assert np.array_equal(quantize_pcm16(x), reference)
    payload = encode_audio_payload(x, 24_000, "pcm16")
    assert memoryview(payload).tobytes() == encode_audio(x, 24_000, "pcm16") == reference.tobytes()
    assert encode_audio_payload(x, 24_000, "flac16") == encode_audio(x, 24_000, "flac16")
