import io
import os

import numpy as np
import pyarrow as pa
import pytest
import soundfile as sf

from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.testing.shards import load_clips

os.environ.setdefault("SPEECHDATA_PROFILE", "tiny")

UPDATE_SPEC_SNAPSHOT = "--update-spec-snapshot"


def pytest_addoption(parser):
    parser.addoption(
        UPDATE_SPEC_SNAPSHOT,
        action="store_true",
        default=False,
        help="rewrite tests/definitions_snapshot.json from the current definitions (review its diff)",
    )


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: without xdist (-p no:xdist) it is never called
def pytest_xdist_make_scheduler(config, log):
    """The longest modules go to the workers first (tests/longest_first.py)."""
    from tests.longest_first import make_scheduler

    return make_scheduler(config, log)


@pytest.fixture
def update_spec_snapshot(request) -> bool:
    return request.config.getoption(UPDATE_SPEC_SNAPSHOT)


@pytest.fixture
def data_root(tmp_path) -> DataRoot:
    return DataRoot(str(tmp_path / "data"))


@pytest.fixture(scope="session")
def clips():
    return load_clips()


def tone(seconds: float, rate: int, freq: float = 440.0, channels: int = 1) -> np.ndarray:
    t = np.arange(int(round(seconds * rate))) / rate
    mono = (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)
    return mono if channels == 1 else np.stack([mono] * channels, axis=1)


def encode(samples: np.ndarray, rate: int, container: str = "WAV", subtype: str = "PCM_16") -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, samples, rate, format=container, subtype=subtype)
    return buffer.getvalue()


def land_shard(
    data_root: DataRoot,
    shard_id: str,
    rows: list[dict],
    files: dict[str, bytes],
    *,
    as_tar: bool = False,
    schema: pa.Schema | None = None,
    table: pa.Table | None = None,
) -> None:
    """Write a shard by hand: metadata rows, audio files (directory or tar), then ``_SUCCESS``."""
    from speechdata.testing.shards import _tar_bytes

    if as_tar:
        data_root.write_bytes(layout.landing_audio_tar(shard_id), _tar_bytes(files))
    else:
        for path, data in files.items():
            data_root.write_bytes(f"{layout.landing_audio_dir(shard_id)}/{path}", data)
    if table is None:
        table = pa.Table.from_pylist(rows, schema=schema)
    data_root.write_parquet(layout.landing_metadata(shard_id), table)
    data_root.write_bytes(layout.landing_success_marker(shard_id), b"")


@pytest.fixture(scope="session")
def model_cache_dir(tmp_path_factory):
    """Tiny models are built once per test session (their save_pretrained/from_pretrained path included)."""
    return str(tmp_path_factory.mktemp("models"))


@pytest.fixture
def tiny_resources(data_root, model_cache_dir):
    """Every resource the code location binds, built for the tiny profile on this test's data root,
    with the models on the CPU (``tests.tiny_resources``)."""
    from tests.tiny_resources import tiny_resources_for

    return tiny_resources_for(data_root.url, model_cache_dir)


@pytest.fixture(scope="session")
def s3_endpoint():
    """An S3-compatible server (moto's server mode) on loopback for the session, credentials in the environment.

    s3fs (the data root's filesystem) and the DuckDB fsspec bridge find it through the standard
    ``AWS_*`` variables, exactly as a production pod finds its bucket.
    """
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint,
        }.items():
            patch.setenv(name, value)
        patch.delenv("AWS_PROFILE", raising=False)
        patch.delenv("AWS_SESSION_TOKEN", raising=False)
        yield endpoint
    server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint, request) -> str:
    """A fresh bucket on the loopback S3 server: ``s3://<bucket>``."""
    import re
    import uuid

    import s3fs

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-") + "-" + uuid.uuid4().hex[:8]
    fs = s3fs.S3FileSystem()
    fs.mkdir(name)
    return f"s3://{name}"


def assert_second_shard_read_ahead(result, asset: str, shards: tuple[str, str]) -> None:
    """A two-shard GPU step: the first shard waited for its own inputs, the second was read ahead."""
    assert result.success
    events = {event.partition: event.metadata for event in result.asset_materializations_for_node(asset)}
    assert [events[s]["inputs_read_ahead"].value for s in shards] == [False, True]
    assert all(events[s]["input_wait_s"].value >= 0 for s in shards)
