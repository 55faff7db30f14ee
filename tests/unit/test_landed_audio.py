"""LandedAudio: a header read by OS path (local folder) is the one read through a handle (tar)."""

import pytest
import soundfile as sf

from speechdata.landing.landed_audio import LandedAudio
from speechdata.testing.shards import build_sample_shard


def test_headers_from_a_folder_by_path_equal_headers_through_the_tar(data_root):
    folder = build_sample_shard(data_root, "folder", 8, seed=2, long_recordings=1)
    build_sample_shard(data_root, "tarred", 8, seed=2, long_recordings=1, as_tar=True)
    paths = sorted(set(folder["audio_path"].to_pylist()))
    assert {p.rsplit(".", 1)[1] for p in paths} == {"wav", "flac", "mp3", "opus"}
    with LandedAudio(data_root, "folder") as by_path, LandedAudio(data_root, "tarred") as by_handle:
        for path in paths:
            # the same seed lands the same audio; only the shard id in the file names differs
            assert by_path.header(path) == by_handle.header(path.replace("folder", "tarred")), path


def test_an_unreadable_file_fails_as_it_does_through_a_handle(data_root):
    build_sample_shard(data_root, "s1", 1, seed=2, long_recordings=0)
    data_root.write_bytes("landing/s1/audio/bad.wav", b"RIFF\x00\x00\x00\x00WAVEjunk")
    with LandedAudio(data_root, "s1") as audio:
        with pytest.raises(sf.LibsndfileError) as by_path:
            audio.header("bad.wav")
        with pytest.raises(sf.LibsndfileError) as by_handle, audio.open("bad.wav") as handle:
            sf.SoundFile(handle)
    # the absolute landed path never reaches a reject's detail
    assert data_root.root not in str(by_path.value)
    assert by_path.value.code == by_handle.value.code
    assert str(by_path.value).rsplit(": ", 1)[1] == str(by_handle.value).rsplit(": ", 1)[1]
