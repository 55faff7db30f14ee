"""The xdist queue order of ``make test``: the known long modules first (tests/longest_first.py)."""

from pathlib import Path

from tests.longest_first import LONGEST_MODULES, longest_first

ROOT = Path(__file__).resolve().parents[2]


def test_every_listed_module_exists_once():
    assert len(set(LONGEST_MODULES)) == len(LONGEST_MODULES)
    assert [m for m in LONGEST_MODULES if not (ROOT / m).is_file()] == []


def test_the_listed_modules_go_first_in_list_order_and_the_others_keep_theirs():
    queue = ["tests/unit/test_b.py", LONGEST_MODULES[2], "tests/unit/test_a.py", LONGEST_MODULES[0]]
    assert longest_first(queue) == [
        LONGEST_MODULES[0],
        LONGEST_MODULES[2],
        "tests/unit/test_b.py",
        "tests/unit/test_a.py",
    ]
