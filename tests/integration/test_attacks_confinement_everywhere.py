"""Confinement as structure: every product folder linked out of the root, every partition-key kind
given a hostile key, through the real assets, and nothing written or read outside the root.

The walks enumerate what they cover, so a new stage is covered without a new test: the product
folders are ``speechdata.io.layout.PRODUCT_FOLDERS`` (and a built root may hold no other top-level
folder), the assets are ``assets.ALL_ASSETS`` and the key kinds their partitions definitions.
"""

from __future__ import annotations

import dataclasses
import graphlib
import os
import shutil
import sys
from collections.abc import Callable

import dagster as dg
import pytest

from assets import ALL_ASSETS
from assets.partitions import PARTITION_KEY_KINDS
from sensors.landing import build_landing_sensor
from speechdata.importers.aligned_json import import_aligned_countries
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.testing.aligned_json import build_aligned_json_corpus
from speechdata.testing.shards import build_sample_shard
from tests.tiny_resources import tiny_resources_for

pytestmark = pytest.mark.slow  # builds a root through every asset, then re-runs them per folder: minutes

SAMPLE_SHARD = "w1"
"""The shard landed for the hostile-key walk."""
COUNTRY = LANGUAGE = "de"
NEEDS_OUTSIDE_SERVICE = {"hf_hub_upload"}
"""Assets that cannot succeed in a test (the Hub): they run in the walks, their own failure ("publishing
is off") is not counted, and they too must write nothing outside the root."""


def tree(directory) -> dict[str, tuple[int, int, int]]:
    """Every folder and file under ``directory`` with its size, mtime and inode: a folder's mtime
    changes when an entry is created or removed in it, so a lock file made and removed shows."""
    found = {}
    for parent, folders, names in os.walk(directory):
        for name in [*folders, *names]:
            path = os.path.join(parent, name)
            stat = os.lstat(path)
            found[path] = (stat.st_size, stat.st_mtime_ns, stat.st_ino)
    return found


class OpenedPaths:
    """Every path this process opens with Python (``open``, ``os.open``) while ``recording``."""

    def __init__(self):
        self.recording = False
        self.paths: list[str] = []
        sys.addaudithook(self._hook)

    def _hook(self, event, args):
        if self.recording and event == "open" and isinstance(args[0], str | bytes):
            self.paths.append(os.fsdecode(args[0]))

    def under(self, folder: str) -> list[str]:
        real = os.path.realpath(folder) + os.sep
        return [p for p in self.paths if os.path.realpath(p).startswith(real) or p.startswith(folder + os.sep)]


OPENED = OpenedPaths()


@dataclasses.dataclass
class Step:
    """One thing the platform runs against the root: an asset (every key of the walk) or a sensor tick."""

    name: str
    upstream: set[str]
    run: Callable[[], str | None]
    """Runs the step; None when it succeeded, else its failure text."""


def topological(assets) -> list:
    by_key = {a.key: a for a in assets}
    order = graphlib.TopologicalSorter(
        {a.key: {dep for dep in a.dependency_keys if dep in by_key} for a in assets}
    ).static_order()
    return [by_key[key] for key in order]


def failure_text(result) -> str:
    return " ".join(
        str(event.event_specific_data.error) for event in result.all_events if event.event_type_value == "STEP_FAILURE"
    )


def asset_step(asset, keys: list[str | None], instance, resources) -> Step:
    def run() -> str | None:
        failures = []
        for key in keys:
            result = dg.materialize(
                [asset], partition_key=key, instance=instance, resources=resources, raise_on_error=False
            )
            if not result.success:
                failures.append(failure_text(result) or "failed")
        return " ".join(failures) or None

    return Step(asset.key.to_user_string(), {dep.to_user_string() for dep in asset.dependency_keys}, run)


def landing_sensor_step(instance, resources) -> Step:
    sensor = build_landing_sensor(max_shards_per_tick=100, batch_shards=1)

    def run() -> str | None:
        try:
            result = sensor(dg.build_sensor_context(instance=instance, resources=resources))
        except Exception as exc:  # a tick that fails shows as the sensor's error in the UI
            return str(exc)
        for request in result.dynamic_partitions_requests or []:  # what the daemon does with them
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        return None

    return Step("landing_sensor", set(), run)


@pytest.fixture(scope="module")
def built(tmp_path_factory, model_cache_dir, clips):
    """A root through the landing sensor and then every asset, one at a time in dependency order; for
    each step, the top-level folders it changed."""
    base = tmp_path_factory.mktemp("everywhere")
    root = DataRoot(str(base / "root"))
    countries = base / "countries"
    build_aligned_json_corpus(countries, {COUNTRY: 1}, clips=clips, audio_format="flac")
    import_aligned_countries(str(countries), root, [COUNTRY])
    resources = tiny_resources_for(root.url, model_cache_dir)
    with dg.instance_for_test() as instance:
        sensor = landing_sensor_step(instance, resources)
        assert sensor.run() is None
        registered = {kind: instance.get_dynamic_partitions(name) for name, kind in PARTITION_KEY_KINDS.items()}
        # One key of each kind: the imported country's shard feeds every product line.
        assert registered == {"shard": registered["shard"], "country": [COUNTRY], "language": [LANGUAGE]}, registered
        keys = {"shard": registered["shard"][:1], "country": [COUNTRY], "language": [LANGUAGE]}
        steps = [sensor] + [
            asset_step(
                asset,
                keys[PARTITION_KEY_KINDS[asset.partitions_def.name]] if asset.partitions_def else [None],
                instance,
                resources,
            )
            for asset in topological(ALL_ASSETS)
        ]
        written_by: dict[str, set[str]] = {"landing_sensor": set()}
        for step in steps[1:]:
            before = {folder: tree(root.path(folder)) for folder in layout.PRODUCT_FOLDERS}
            failure = step.run()
            assert failure is None or step.name in NEEDS_OUTSIDE_SERVICE, (step.name, failure)
            written_by[step.name] = {f for f in layout.PRODUCT_FOLDERS if tree(root.path(f)) != before[f]}
        # The sensor's state was written by the first tick; a later tick that sees a re-landing writes it again.
        written_by["landing_sensor"] = {layout.STATE}
        yield root, steps, written_by


def test_a_built_root_holds_only_the_product_folders_and_each_is_written_by_a_step(built):
    root, _, written_by = built
    top = set(os.listdir(root.root)) - set(layout.CATALOG_FILES)
    assert top <= set(layout.PRODUCT_FOLDERS), "a new top-level folder: add it to layout.PRODUCT_FOLDERS"
    written = set().union(*written_by.values())
    assert set(layout.PRODUCT_FOLDERS) - {layout.LANDING} <= written, written_by


def refusals_naming(folder: str) -> list[str]:
    """The confinement errors that name ``folder``: DataRoot's, and the landing edge's stricter one."""
    refusals = [f"'{folder}' resolves to"]
    if folder == layout.LANDING:
        refusals.append("(a symlinked shard or landing folder)")
    if folder == layout.SHARDS:
        refusals.append("refusing shard output folder")
    return refusals


@pytest.mark.parametrize("folder", layout.PRODUCT_FOLDERS)
def test_a_product_folder_linked_out_of_the_root_is_refused_by_name_and_nothing_outside_is_touched(
    built, folder, tmp_path
):
    root, steps, written_by = built
    writers = {name for name, folders in written_by.items() if folder in folders}
    readers = {
        step.name for step in steps if step.upstream & writers or (folder == layout.LANDING and not step.upstream)
    }
    # A writer's inputs are made again first, so it has something to write (a commit of staged files).
    feeding = set().union(*(step.upstream for step in steps if step.name in writers))
    runs = [step for step in steps if step.name in writers | readers | feeding]
    assert runs, f"no step writes or reads {folder}/"
    outside = tmp_path / "elsewhere" / folder
    os.makedirs(outside.parent)
    inside = root.path(folder)
    shutil.move(inside, outside)
    os.symlink(outside, inside)
    if folder == layout.STATE:  # the sensor writes its state when a shard's files change
        for shard in os.listdir(root.path(layout.LANDING)):
            os.utime(root.path(layout.landing_success_marker(shard)))
    before = tree(outside.parent)
    try:
        OPENED.recording, OPENED.paths = True, []
        outcomes = {step.name: step.run() for step in runs}
        OPENED.recording = False
        assert tree(outside.parent) == before, f"written outside the root through {folder}/"
        assert OPENED.under(str(outside)) == [], f"read outside the root through {folder}/"
        failures = {name: text for name, text in outcomes.items() if text and name not in NEEDS_OUTSIDE_SERVICE}
        for name, failure in failures.items():
            assert any(refusal in failure for refusal in refusals_naming(folder)), (name, failure)
        # A writer whose inputs were refused may have nothing left to write; some step met the link.
        assert failures, f"no step was refused writing {folder}/ through a link out of the root: {sorted(outcomes)}"
    finally:
        OPENED.recording = False
        os.unlink(inside)
        shutil.move(outside, inside)


PARTITIONED_ASSETS = [asset for asset in ALL_ASSETS if asset.partitions_def is not None]
HOSTILE_KEY = "../../../../../escaped"
"""Deep enough to leave the root from every folder a key names (``hf/_state/<dataset>/<key>.duckdb``)."""


def test_every_partitions_definition_has_a_key_kind():
    names = {asset.partitions_def.name for asset in PARTITIONED_ASSETS}
    assert names <= set(PARTITION_KEY_KINDS), "a new partitions definition: give it a key kind"
    assert set(PARTITION_KEY_KINDS.values()) <= set(layout.KEY_KINDS)


@pytest.mark.parametrize("asset", PARTITIONED_ASSETS, ids=lambda asset: asset.key.to_user_string())
def test_a_hand_added_hostile_key_of_every_kind_fails_every_partitioned_asset_before_anything_is_written(
    asset, tmp_path, model_cache_dir
):
    root = DataRoot(str(tmp_path / "a" / "b" / "c" / "root"))
    build_sample_shard(root, SAMPLE_SHARD, 2, seed=5, long_recordings=0)
    kind = PARTITION_KEY_KINDS[asset.partitions_def.name]
    before = tree(tmp_path)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(asset.partitions_def.name, [HOSTILE_KEY])  # as the UI's "Add partition" does
        result = dg.materialize(
            [asset],
            partition_key=HOSTILE_KEY,
            instance=instance,
            resources=tiny_resources_for(root.url, model_cache_dir),
            raise_on_error=False,
        )
    assert not result.success
    what = layout.KEY_KINDS[kind][0]
    assert f"refusing {what} '{HOSTILE_KEY}': a" in failure_text(result)
    assert tree(tmp_path) == before


def test_no_stored_file_of_a_built_root_names_the_root_by_its_absolute_path(built):
    root, _, _ = built
    prefixes = [prefix.encode() for prefix in root.absolute_prefixes()]
    found = {}
    for parent, _, names in os.walk(root.root):
        for name in names:
            path = os.path.join(parent, name)
            if name in layout.CATALOG_FILES or os.path.islink(path):
                continue
            with open(path, "rb") as handle:
                data = handle.read()
            hits = [prefix.decode() for prefix in prefixes if prefix in data]
            if hits:
                found[os.path.relpath(path, root.root)] = hits
    assert found == {}
