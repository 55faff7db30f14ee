"""The ``full`` profile without Hub access fails at once, naming SPEECHDATA_PROFILE and the offline profiles.

The Hub is a local socket here: one that refuses, one that accepts and hangs up, one that never
answers, one that answers HTTP; each counts the connections it was offered, so "no minute of
retries" is asserted as "one request", not as a time.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from huggingface_hub import constants

from speechdata import hub_access
from speechdata.hub_access import HubUnreachable, hub_model_access, offline_profiles
from speechdata.profiles import PROFILE_ENV, PROFILES

REPOSITORY = Path(__file__).resolve().parents[2]
MODEL = "Qwen/Qwen3-1.7B"


class CountingHub:
    """A TCP server on 127.0.0.1: ``mode`` ``hang_up`` closes each connection, ``silent`` never
    answers, ``http`` answers ``200 OK``. ``connections`` counts what it accepted."""

    def __init__(self, mode: str):
        self.mode = mode
        self.connections = 0
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self._open: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.getsockname()[1]}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            self.connections += 1
            if self.mode == "hang_up":
                conn.close()
            elif self.mode == "silent":
                self._open.append(conn)
            else:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                conn.close()

    def __enter__(self) -> CountingHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        for conn in self._open:
            conn.close()
        self._server.close()


def closed_port_endpoint() -> str:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@contextmanager
def hub_at(monkeypatch, endpoint: str, cache: Path, offline: bool = False) -> Iterator[None]:
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.delenv(PROFILE_ENV, raising=False)
    monkeypatch.setattr(hub_access, "_PROBES", {})
    yield


def assert_names_the_way_out(message: str, model: str = MODEL) -> None:
    assert model in message
    assert PROFILE_ENV in message
    for profile in offline_profiles():
        assert profile in message
    assert "full" in message


def test_offline_profiles_are_every_profile_but_full():
    assert offline_profiles() == tuple(p for p in PROFILES if p != "full")
    assert "tiny" in offline_profiles()


def test_a_hub_that_refuses_fails_at_once_with_the_way_out(monkeypatch, tmp_path):
    with hub_at(monkeypatch, closed_port_endpoint(), tmp_path), pytest.raises(HubUnreachable) as raised:
        hub_model_access(MODEL)
    message = str(raised.value)
    assert_names_the_way_out(message)
    assert "ConnectionRefusedError" in message or "Connection refused" in message
    assert f"{PROFILE_ENV} is unset, so the profile is 'full'" in message


def test_a_hub_that_hangs_up_is_asked_once_per_process(monkeypatch, tmp_path):
    with CountingHub("hang_up") as hub, hub_at(monkeypatch, hub.endpoint, tmp_path):
        for model in (MODEL, "microsoft/wavlm-large", "nvidia/parakeet-ctc-1.1b"):
            with pytest.raises(HubUnreachable) as raised:
                hub_model_access(model)
            assert_names_the_way_out(str(raised.value), model)
    assert hub.connections == 1


def test_a_failed_probe_is_asked_again_after_a_while(monkeypatch, tmp_path):
    with CountingHub("hang_up") as hub, hub_at(monkeypatch, hub.endpoint, tmp_path):
        assert hub_access.hub_unanswered_reason(hub.endpoint) is not None
        assert hub_access.hub_unanswered_reason(hub.endpoint) is not None
        monkeypatch.setattr(hub_access, "FAILED_PROBE_KEPT_S", -1.0)
        assert hub_access.hub_unanswered_reason(hub.endpoint) is not None
    assert hub.connections == 2


def test_a_hub_that_never_answers_is_given_up_on(monkeypatch, tmp_path):
    with CountingHub("silent") as hub, hub_at(monkeypatch, hub.endpoint, tmp_path):
        reason = hub_access.hub_unanswered_reason(hub.endpoint, timeout_s=0.5)
    assert reason is not None and ("0.5 s" in reason or "timed out" in reason), reason
    assert hub.connections == 1


def test_offline_mode_asks_nothing(monkeypatch, tmp_path):
    with CountingHub("http") as hub, hub_at(monkeypatch, hub.endpoint, tmp_path, offline=True):
        with pytest.raises(HubUnreachable, match="HF_HUB_OFFLINE is set") as raised:
            hub_model_access(MODEL)
        assert_names_the_way_out(str(raised.value))
    assert hub.connections == 0


def test_a_hub_that_answers_is_used(monkeypatch, tmp_path):
    with CountingHub("http") as hub, hub_at(monkeypatch, hub.endpoint, tmp_path):
        assert hub_model_access(MODEL) is False
        assert hub_model_access("microsoft/wavlm-large") is False
    assert hub.connections == 1


def _cache_model(cache: Path, model: str) -> None:
    repo = cache / f"models--{model.replace('/', '--')}"
    sha = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(sha)
    (repo / "snapshots" / sha).mkdir(parents=True)
    (repo / "snapshots" / sha / "config.json").write_text("{}")


def test_a_cached_model_loads_from_the_cache_without_the_hub(monkeypatch, tmp_path):
    _cache_model(tmp_path, MODEL)
    with hub_at(monkeypatch, closed_port_endpoint(), tmp_path):
        assert hub_model_access(MODEL) is True
    with hub_at(monkeypatch, closed_port_endpoint(), tmp_path, offline=True):
        assert hub_model_access(MODEL) is True


def test_a_local_folder_asks_nothing(monkeypatch, tmp_path):
    with CountingHub("hang_up") as hub, hub_at(monkeypatch, hub.endpoint, tmp_path):
        assert hub_model_access(str(tmp_path)) is True
        # A path not made yet (a model a script builds) is never taken for a Hub id.
        for path in (str(tmp_path / "not_built_yet"), "./models/aligner", "~/models/aligner", "a/b/c"):
            assert hub_model_access(path) is True
        assert hub_model_access(MODEL, local_files_only=True) is True
    assert hub.connections == 0


FULL_PROFILE_RESOURCES = """
import json
from resources.aligner import aligner_resource
from resources.encoders import qwen_resource
from resources.quality import quality_models_resource
from resources.settings import ResourceSettings
from resources.text_tokenizer import text_tokenizer_resource
from resources.torch_device import TorchDeviceResource
from speechdata.profiles import profile_from_env

settings = ResourceSettings(data_root_url="unused", profile=profile_from_env(), model_cache_dir="unused")
device = TorchDeviceResource(device="cpu")
loads = {
    "text_tokenizer": lambda: text_tokenizer_resource(settings).get(),
    "aligner": lambda: aligner_resource(settings).aligner_for("en"),
    "qwen": lambda: qwen_resource(settings).model(device),
    "audio_language": lambda: quality_models_resource(settings).audio_language(device),
}
errors = {}
for name, load in loads.items():
    try:
        load()
        errors[name] = None
    except Exception as error:
        errors[name] = [type(error).__name__, str(error)]
print(json.dumps(errors))
"""


@pytest.mark.slow  # a fresh interpreter that imports torch: 15-35 s here, the rest of the module ~3 s
def test_the_full_profiles_resources_fail_fast_without_the_hub(tmp_path):
    """The resources a `dagster asset materialize` step builds in the default profile, in a fresh
    process with the Hub at a socket that hangs up: each names the way out, one connection in all."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_", "SPEECHDATA_PROFILE"))},
        "HF_HOME": str(tmp_path / "hf"),
        "PYTHONPATH": str(REPOSITORY),
    }
    with CountingHub("hang_up") as hub:
        env["HF_ENDPOINT"] = hub.endpoint
        proc = subprocess.run(
            [sys.executable, "-c", FULL_PROFILE_RESOURCES],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPOSITORY,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, error in errors.items():
        assert error is not None, f"{name} loaded without the Hub"
        kind, message = error
        assert kind == "HubUnreachable", (name, error)
        assert f"{PROFILE_ENV} is unset, so the profile is 'full'" in message
        assert all(profile in message for profile in offline_profiles())
    assert hub.connections == 1
