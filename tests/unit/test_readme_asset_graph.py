"""README.md's mermaid diagram is the code location's asset graph: every node an asset key, every
arrow a dependency, and no asset or dependency left out, so the picture a reader starts from can't
drift from ``dagster_project.definitions.defs``."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from dagster_project.definitions import defs

REPO = Path(__file__).resolve().parents[2]
MERMAID_BLOCK = re.compile(r"^```mermaid\n(.*?)^```$", re.MULTILINE | re.DOTALL)
NODE_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def mermaid_edges(block: str) -> set[tuple[str, str]]:
    """``a & b --> c --> d`` is the edges a->c, b->c and c->d: mermaid's chains and ``&`` groups,
    the only syntax the README's diagram uses (anything else fails here rather than being skipped)."""
    lines = [line.strip() for line in block.splitlines() if line.strip() and not line.strip().startswith("%%")]
    assert lines[0] == "flowchart LR", lines[0]
    edges = set()
    for line in lines[1:]:
        stages = [[node.strip() for node in stage.split("&")] for stage in line.split("-->")]
        assert len(stages) >= 2, f"not an edge line: {line!r}"
        for node in itertools.chain.from_iterable(stages):
            assert NODE_ID.fullmatch(node), f"not a plain asset key: {node!r} in {line!r}"
        for upstream, downstream in itertools.pairwise(stages):
            edges |= set(itertools.product(upstream, downstream))
    return edges


def readme_diagram() -> str:
    blocks = MERMAID_BLOCK.findall((REPO / "README.md").read_text())
    assert len(blocks) == 1, f"expected one mermaid block in README.md, found {len(blocks)}"
    return blocks[0]


def code_location_edges() -> set[tuple[str, str]]:
    graph = defs.resolve_asset_graph()
    return {
        (parent.to_user_string(), key.to_user_string())
        for key in graph.get_all_asset_keys()
        for parent in graph.get(key).parent_keys
    }


def test_mermaid_parser_expands_chains_and_groups():
    assert mermaid_edges("flowchart LR\n  a & b --> c --> d\n") == {("a", "c"), ("b", "c"), ("c", "d")}


def test_readme_diagram_nodes_are_the_asset_keys():
    graph = defs.resolve_asset_graph()
    assets = {key.to_user_string() for key in graph.get_all_asset_keys()}
    drawn = {node for edge in mermaid_edges(readme_diagram()) for node in edge}
    assert not drawn - assets, f"in the diagram but not an asset: {sorted(drawn - assets)}"
    assert not assets - drawn, f"an asset the diagram leaves out: {sorted(assets - drawn)}"


def test_readme_diagram_edges_are_the_asset_dependencies():
    drawn = mermaid_edges(readme_diagram())
    real = code_location_edges()
    assert not drawn - real, f"arrows that are no dependency: {sorted(drawn - real)}"
    assert not real - drawn, f"dependencies the diagram leaves out: {sorted(real - drawn)}"
