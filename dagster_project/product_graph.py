"""The load-time check that the asset graph agrees with the product registry (:mod:`speechdata.products`).

A product line's record names the asset writing its output and the stages whose rejects its ledger
counts; the asset graph says what each asset depends on. They are two declarations of one thing, so
the code location refuses to load when they disagree, naming the line and the asset: a stage that
is no asset, an output asset that is missing, or a stage that is not upstream of the output (its
ledger would count rejects of a stage the product never waited for).
"""

from __future__ import annotations

from collections.abc import Iterable

import dagster as dg

from speechdata import products


class ProductGraphMismatch(ValueError):
    """A product line's record and the asset graph disagree; the message names the line and asset."""


def upstream_of(key: dg.AssetKey, deps: dict[dg.AssetKey, set[dg.AssetKey]]) -> set[dg.AssetKey]:
    """Every asset ``key`` depends on, directly or not."""
    seen: set[dg.AssetKey] = set()
    todo = list(deps.get(key, ()))
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(deps.get(current, ()))
    return seen


def asset_dependencies(assets: Iterable[dg.AssetsDefinition]) -> dict[dg.AssetKey, set[dg.AssetKey]]:
    """Asset key -> the keys it depends on, over every spec of ``assets``."""
    return {spec.key: {dep.asset_key for dep in spec.deps} for asset in assets for spec in asset.specs}


def check_product_lines(
    assets: Iterable[dg.AssetsDefinition], lines: Iterable[products.ProductLine] | None = None
) -> None:
    """Raise :class:`ProductGraphMismatch` unless every product line's assets exist and its ledger's
    stages lie upstream of (or are) its output asset; its own stages and catalog assets must exist."""
    deps = asset_dependencies(assets)
    problems = []
    unbuilt = sorted(stage for stage in products.SHARED_STAGES if dg.AssetKey(stage) not in deps)
    if unbuilt:
        problems.append(f"shared stage(s) {unbuilt} of speechdata.products.SHARED_STAGES are no asset")
    for line in products.product_lines() if lines is None else lines:
        output = dg.AssetKey(line.output_asset)
        named = [line.output_asset, *line.builds, *line.catalog_assets, *line.stages]
        missing = sorted({name for name in named if dg.AssetKey(name) not in deps})
        if missing:
            problems.append(f"product line {line.name!r} names asset(s) the code location lacks: {missing}")
            continue
        feeding = upstream_of(output, deps) | {output}
        detached = [stage for stage in line.stages if dg.AssetKey(stage) not in feeding]
        if detached:
            problems.append(
                f"product line {line.name!r}: stage(s) {detached} of its ledger are not upstream of its "
                f"output asset {line.output_asset!r}"
            )
    if problems:
        raise ProductGraphMismatch("; ".join(problems) + " (speechdata/products.py, docs/contributing.md)")
