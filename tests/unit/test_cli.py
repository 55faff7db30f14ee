"""The ``speechdata`` console script: help, usage errors, ``land`` and an import, as a user runs them."""

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.raw_shard import validate_landed_shard
from tests.conftest import encode, tone

pytestmark = pytest.mark.slow  # every test starts the console script in a new interpreter

SPEECHDATA = str(Path(sys.executable).parent / "speechdata")
SUBCOMMANDS = [
    ["import"],
    ["import", "segment-tars"],
    ["import", "aligned-json"],
    ["import", "granary"],
    ["import", "language-tars"],
    ["catalog"],
    ["mfa-corpus"],
    ["land"],
    ["shard"],
    ["shard", "status"],
    ["shard", "run"],
    ["shard", "backfill"],
    ["near-duplicates"],
    ["near-duplicates", "batch"],
    ["near-duplicates", "compact"],
]


def speechdata(*args, **env):
    import os

    return subprocess.run([SPEECHDATA, *args], capture_output=True, text=True, timeout=120, env={**os.environ, **env})


def test_help_lists_every_command_with_an_example():
    proc = speechdata("--help")
    assert proc.returncode == 0, proc.stderr
    for command in ("import", "catalog", "mfa-corpus", "land", "shard"):
        assert f"    {command}" in proc.stdout
    assert "examples:" in proc.stdout


@pytest.mark.parametrize("command", SUBCOMMANDS, ids=" ".join)
def test_each_subcommand_has_help_with_an_example(command):
    proc = speechdata(*command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: speechdata {' '.join(command)}")
    assert "example" in proc.stdout


@pytest.mark.parametrize(
    "args",
    [[], ["frobnicate"], ["import"], ["import", "no-such-format"], ["land"], ["catalog", "--limit", "many"]],
    ids=lambda a: " ".join(a) or "nothing",
)
def test_bad_usage_exits_2_with_a_usage_line(args):
    proc = speechdata(*args)
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: speechdata")


def _write_shard(root: DataRoot, shard_id: str, start_s_type=pa.float64()) -> None:
    files = {"a.wav": encode(tone(1.0, 16_000), 16_000), "b.wav": encode(tone(0.5, 16_000), 16_000)}
    for name, data in files.items():
        root.write_bytes(f"{layout.landing_audio_dir(shard_id)}/{name}", data)
    rows = [
        {"utt_id": "u1", "audio_path": "a.wav", "language": "en", "start_s": None},
        {"utt_id": "u2", "audio_path": "b.wav", "language": "en", "start_s": None},
        {"utt_id": "u3", "audio_path": "missing.wav", "language": "en", "start_s": None},
    ]
    schema = pa.schema(
        [("utt_id", pa.string()), ("audio_path", pa.string()), ("language", pa.string()), ("start_s", start_s_type)]
    )
    root.write_parquet(layout.landing_metadata(shard_id), pa.Table.from_pylist(rows, schema=schema))


def test_land_marks_a_valid_directory_and_lists_its_rejects(data_root):
    _write_shard(data_root, "good-0001")
    proc = speechdata("land", data_root.path(layout.landing_dir("good-0001")))
    assert proc.returncode == 0, proc.stderr
    assert data_root.exists(layout.landing_success_marker("good-0001"))
    assert "2 of 3 utterances usable" in proc.stdout
    assert "reject u3: audio_not_found" in proc.stderr

    strict = speechdata("land", "--strict", data_root.path(layout.landing_dir("good-0001")))
    assert strict.returncode == 1 and "--strict and rejected rows" in strict.stderr


def test_land_refuses_a_directory_that_breaks_the_contract_naming_file_column_and_rule(data_root):
    _write_shard(data_root, "bad-0001", start_s_type=pa.string())
    proc = speechdata("land", data_root.path(layout.landing_dir("bad-0001")))
    assert proc.returncode == 1
    [line] = proc.stderr.strip().splitlines()
    assert "landing/bad-0001/metadata.parquet, column 'start_s': must be of type double, found string" in line
    assert not data_root.exists(layout.landing_success_marker("bad-0001"))

    elsewhere = speechdata("land", str(Path(data_root.root) / "not-landing" / "x-0001"))
    assert elsewhere.returncode == 1 and "not a landing shard directory" in elsewhere.stderr


def test_import_segment_tars_through_the_cli_lands_a_shard_the_contract_accepts(tmp_path, clips):
    from speechdata.importers.segment_tars import build_segment_tar_sample

    build_segment_tar_sample(str(tmp_path / "seed"), clips, n_segments=6)
    root = DataRoot(str(tmp_path / "data"))
    proc = speechdata(
        "import", "segment-tars", str(tmp_path / "seed"), "asr-hi-0001", "--language", "hi", DATA_ROOT=root.root
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "landed 6 rows as asr-hi-0001"
    assert root.exists(layout.landing_success_marker("asr-hi-0001"))
    validation = validate_landed_shard(root, "asr-hi-0001")
    assert validation.landed_rows == 6 and validation.index.num_rows + len(validation.rejects) == 6

    missing = speechdata("import", "segment-tars", str(tmp_path / "nowhere"), "asr-hi-0002", DATA_ROOT=root.root)
    assert missing.returncode == 1 and missing.stderr.startswith("speechdata import segment-tars: error:")


def test_old_module_entry_points_still_run():
    for module in ("speechdata.importers.granary", "speechdata.catalog.cli", "dagster_project.catalog"):
        proc = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and proc.stdout.startswith("usage:"), (module, proc.stderr)
