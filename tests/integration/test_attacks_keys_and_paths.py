"""One key validator and one confinement check, wherever a key or a path enters: every layout
function, every command-line argument naming a key, ``DataRoot`` itself; and no absolute path of
the root in any stored reject (the same shard writes the same ledgers under any root).
"""

from __future__ import annotations

import argparse
import inspect
import os

import pyarrow as pa
import pytest

from speechdata.accounting.rejects import Reject, rejects_table
from speechdata.cli import build_parser, run
from speechdata.io import layout
from speechdata.io.storage import AbsolutePathStored, DataRoot, OutsideDataRoot
from speechdata.landing.ingest import run_normalized_audio, run_raw_shards
from tests.conftest import encode, land_shard, tone

HOSTILE = "../../../../victim/s1"

SAMPLE_ARGUMENTS = {
    "shard_id": "s1",
    "country": "de",
    "language": "en",
    "dataset": "speech-segments",
    "utt_id": "u1",
    "stage": "raw_shards",
    "level": "words",
    "split": "train",
    "suffix": "parquet",
    "number": 0,
    "sha256": "0" * 64,
    "audio_sha1": "0" * 40,
    "version": "v1",
    "path_in_repo": "README.md",
    "name": "transcripts.parquet",
}
KEY_PARAMETERS = {"shard_id", "country", "language", "dataset", "utt_id", "stage", "level", "split", "version", "name"}
LAYOUT_FUNCTIONS = [
    function
    for name, function in vars(layout).items()
    if inspect.isfunction(function)
    and function.__module__ == layout.__name__
    and not name.startswith("_")
    and name != "validate_key"
    and function.__annotations__.get("return") == "str"
]


def snapshot(directory) -> dict[str, tuple[int, int]]:
    found = {}
    for parent, folders, names in os.walk(directory):
        for name in [*folders, *names]:
            stat = os.lstat(os.path.join(parent, name))
            found[os.path.join(parent, name)] = (stat.st_size, stat.st_mtime_ns)
    return found


@pytest.mark.parametrize("function", LAYOUT_FUNCTIONS, ids=lambda function: function.__name__)
def test_every_layout_function_refuses_a_hostile_key_and_names_a_product_folder(function):
    parameters = list(inspect.signature(function).parameters)
    unknown = set(parameters) - set(SAMPLE_ARGUMENTS)
    assert not unknown, f"layout.{function.__name__}: give {unknown} a sample here (and a key kind if it is a key)"
    arguments = {name: SAMPLE_ARGUMENTS[name] for name in parameters}
    path = function(**arguments)
    assert DataRoot("/tmp/root").path(path)  # a plain relative path
    assert path.split("/")[0] in layout.PRODUCT_FOLDERS + layout.CATALOG_FILES
    for name in set(parameters) & KEY_PARAMETERS:
        for hostile in ("..", "../x", "a/b", "", "x\x00"):
            with pytest.raises(layout.InvalidKey, match="refusing"):
                function(**{**arguments, name: hostile})


def test_the_root_refuses_paths_that_leave_it_and_names_the_folder_that_links_out(tmp_path):
    root = DataRoot(str(tmp_path / "root"))
    os.makedirs(root.root)
    for relative in ("../x", "/../x", "shards/../../x", "a//b", "a/./b", "x\x00"):
        with pytest.raises(OutsideDataRoot, match="must be a plain relative path"):
            root.path(relative)
    assert root.path("/etc/passwd") == f"{root.root}/etc/passwd"  # joined to the root, as it always was
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", root.path("bridge"))
    with pytest.raises(OutsideDataRoot, match=r"'bridge' resolves to .*elsewhere', outside the data root"):
        root.write_bytes("bridge/x.tar", b"x")
    with pytest.raises(OutsideDataRoot, match="'bridge' resolves to"):
        root.glob("bridge/*.tar")
    assert os.listdir(tmp_path / "elsewhere") == []
    # The root itself may be a link, and a link that stays inside the root is fine.
    os.symlink(root.root, tmp_path / "linked-root")
    os.makedirs(root.path("shards/s1"))
    os.symlink(root.path("shards/s1"), root.path("shards/alias"))
    DataRoot(str(tmp_path / "linked-root")).write_bytes("shards/alias/x", b"x")
    assert os.path.exists(root.path("shards/s1/x"))


def test_a_stored_table_never_holds_the_roots_absolute_path(tmp_path):
    root = DataRoot(str(tmp_path / "root"))
    absolute = root.path(layout.landing_metadata("s1"))
    ledger = rejects_table([Reject("u1", "raw_shards", "invalid_country", f"{absolute}, field 'country': bad")])
    root.write_parquet(layout.rejects("s1", "raw_shards"), ledger)
    stored = root.read_parquet(layout.rejects("s1", "raw_shards"))
    assert stored["detail"].to_pylist() == ["landing/s1/metadata.parquet, field 'country': bad"]
    with pytest.raises(AbsolutePathStored, match=r"column 'tar_url' holds the data root's absolute path"):
        root.write_parquet("manifests/shard=s1/part-0.parquet", pa.table({"tar_url": [root.uri("bridge/x.tar")]}))
    with (
        pytest.raises(AbsolutePathStored, match="'flac_path'"),
        root.parquet_writer("shards/s1/asr_flac.parquet", pa.schema([("flac_path", pa.string())])) as writer,
    ):
        writer.write_table(pa.table({"flac_path": [root.path("asr/flac/s1/u1.flac")]}))
    assert not root.exists("shards/s1/asr_flac.parquet")


def land_the_same_shard(data_root: DataRoot) -> None:
    land_shard(
        data_root,
        "same",
        [
            {"utt_id": "ok", "audio_path": "ok.wav", "country": "de", "language": "de"},
            {"utt_id": "france", "audio_path": "ok.wav", "country": "france", "language": "fr"},
            {"utt_id": "missing", "audio_path": "gone.wav", "country": "de", "language": "de"},
            {"utt_id": "noise", "audio_path": "noise.wav", "country": "de", "language": "de"},
        ],
        {"ok.wav": encode(tone(1.0, 16_000), 16_000), "noise.wav": b"RIFF not audio" * 30},
    )


def test_the_same_shard_writes_byte_identical_ledgers_under_two_roots_and_none_names_its_root(tmp_path):
    roots = [DataRoot(str(tmp_path / "one")), DataRoot(str(tmp_path / "a-much-longer" / "second-root"))]
    stored = []
    for root in roots:
        land_the_same_shard(root)
        run_raw_shards(root, "same")
        run_normalized_audio(root, "same")
        files = {}
        for path in sorted(root.glob(f"{layout.shard_dir('same')}/**")):
            if root.fs.isfile(path):
                files[path[len(root.root) + 1 :]] = root.fs.cat_file(path)
        stored.append(files)
        for relative, data in files.items():
            for prefix in root.absolute_prefixes():
                assert prefix.encode() not in data, (relative, prefix)
    assert layout.rejects("same", "raw_shards") in stored[0]
    reasons = roots[0].read_parquet(layout.rejects("same", "raw_shards"))["reason"].to_pylist()
    assert "invalid_country" in reasons
    assert stored[0] == stored[1]


def _leaf_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers and path:
        yield path, parser
    for action in subparsers:
        for name, sub in action.choices.items():
            yield from _leaf_commands(sub, (*path, name))


KEY_DESTS = {"shard_id", "legacy_shard_id", "shards", "shard_prefix", "language", "country"}
"""Argument names that carry a partition key or an identifier that becomes one."""

NOT_PATHS = {
    ("catalog", "language"): "a SQL filter value, bound as a parameter",
    ("catalog", "country"): "a SQL filter value, bound as a parameter",
    ("import", "aligned-json", "country"): "selects source folders by name; shard ids are derived and validated",
    ("import", "aligned-json", "language"): "COUNTRY=LANG pairs: each language is checked by the landing contract",
    **{
        (*command, dest): "a filter value"
        for command in [("export", n) for n in ("nemo", "lhotse", "moshi")]
        for dest in ("language", "country")
    },
}

KEY_ARGUMENT_CASES = {
    ("mfa-corpus", "shard_id"): ["mfa-corpus", HOSTILE],
    ("mfa-corpus", "legacy_shard_id"): ["mfa-corpus", "{root}", HOSTILE],
    ("import", "granary", "shard_id"): ["import", "granary", HOSTILE, "{source}/x.parquet"],
    ("import", "granary", "language"): ["import", "granary", "g1", "{source}/x.parquet", "--language", HOSTILE],
    ("import", "segment-tars", "shard_id"): ["import", "segment-tars", "{source}", HOSTILE],
    ("import", "segment-tars", "language"): ["import", "segment-tars", "{source}", "s1", "--language", HOSTILE],
    ("import", "language-tars", "shard_prefix"): [
        "import",
        "language-tars",
        "{source}/x.tar",
        "--index",
        "{source}/i.parquet",
        "--shard-prefix",
        HOSTILE,
    ],
    ("shard", "status", "shard_id"): ["shard", "status", HOSTILE],
    ("shard", "run", "shards"): ["shard", "run", "--shards", f"a,{HOSTILE}"],
    ("shard", "backfill", "shards"): ["shard", "backfill", "--shards", HOSTILE],
    ("near-duplicates", "batch", "shards"): ["near-duplicates", "batch", "s1", HOSTILE, "--in-process"],
}


def test_every_command_argument_naming_a_key_is_covered():
    found = {
        (*path, action.dest)
        for path, parser in _leaf_commands(build_parser())
        for action in parser._actions
        if action.dest in KEY_DESTS
    }
    assert found - set(NOT_PATHS) == set(KEY_ARGUMENT_CASES)


@pytest.mark.parametrize("case", sorted(KEY_ARGUMENT_CASES), ids=" ".join)
def test_a_command_given_a_hostile_key_exits_2_naming_it_before_touching_anything(case, tmp_path, capsys):
    root, source = tmp_path / "deep" / "er" / "root", tmp_path / "source"
    os.makedirs(root)
    os.makedirs(source)
    argv = [arg.format(root=root, source=source) for arg in KEY_ARGUMENT_CASES[case]]
    if "{root}" not in KEY_ARGUMENT_CASES[case]:
        argv += ["--data-root", str(root)]
    before = snapshot(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        run(argv)
    assert exit_.value.code == 2
    what = "language" if case[-1] == "language" else "shard id"
    assert f"refusing {what} '{HOSTILE}'" in capsys.readouterr().err
    assert snapshot(tmp_path) == before


def test_mfa_corpus_of_a_shard_id_that_climbs_out_of_the_root_reads_and_writes_nothing(tmp_path, capsys):
    root = DataRoot(str(tmp_path / "deep" / "er" / "root"))
    victim = DataRoot(str(tmp_path / "victim" / "s1"))
    land_the_same_shard(victim)
    run_raw_shards(victim, "same")
    run_normalized_audio(victim, "same")
    for name in ("utterances.parquet", "audio_24k.parquet"):  # where shards/../../../../victim/s1/ reads them
        victim.fs.copy(victim.path(f"shards/same/{name}"), victim.path(name))
    os.makedirs(root.path(layout.SHARDS))  # a root in use: the kernel resolves shards/.. only when it exists
    assert os.path.realpath(os.path.join(root.path("shards"), HOSTILE)) == victim.root
    before = snapshot(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        run(["mfa-corpus", HOSTILE, "--data-root", root.root])
    assert exit_.value.code == 2
    assert f"refusing shard id '{HOSTILE}': a shard id must match" in capsys.readouterr().err
    assert snapshot(tmp_path) == before
