from speechdata.io import layout
from speechdata.io.storage import escape_glob
from speechdata.landing.scan import scan_landing_zone, success_marker_times


def make_dirs(data_root, complete: list[str], landing: list[str]):
    # Spelled by hand, as a user lands them: layout's functions refuse a name that is not a shard id.
    for name in complete:
        data_root.write_bytes(f"{layout.LANDING}/{name}/{layout.SUCCESS_MARKER}", b"")
    for name in landing:
        data_root.write_bytes(f"{layout.LANDING}/{name}/{layout.METADATA_FILE}", b"")


def test_empty_or_missing_landing_zone(data_root):
    assert scan_landing_zone(data_root, set(), 10).complete == []


def test_only_complete_unregistered_shards_are_returned_in_order(data_root):
    make_dirs(data_root, ["c", "a", "b"], ["d"])
    scan = scan_landing_zone(data_root, {"b"}, 10)
    assert scan.complete == ["a", "c"]
    assert scan.still_landing == ["d"]
    assert not scan.more_complete


def test_limit_caps_the_shards_per_scan(data_root):
    make_dirs(data_root, [f"s{i:02d}" for i in range(5)], [])
    scan = scan_landing_zone(data_root, set(), 2)
    assert scan.complete == ["s00", "s01"] and scan.more_complete


def test_directories_that_are_not_shard_ids_are_never_registered(data_root):
    make_dirs(data_root, ["Bad.Name", "ok"], [])
    scan = scan_landing_zone(data_root, set(), 10)
    assert scan.complete == ["ok"] and scan.invalid_names == ["Bad.Name"]


def test_success_marker_times_on_a_local_root_match_the_filesystem_listing(data_root):
    make_dirs(data_root, ["c", "a"], ["d"])
    data_root.fs.makedirs(data_root.path(layout.landing_dir("empty")), exist_ok=True)
    pattern = f"{escape_glob(data_root.root)}/{layout.landing_success_marker('*')}"
    listed = {p.split("/")[-2]: info["mtime"] for p, info in data_root.fs.glob(pattern, detail=True).items()}
    assert success_marker_times(data_root) == listed and set(listed) == {"a", "c"}
