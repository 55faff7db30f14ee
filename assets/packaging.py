"""[packaging] WebDataset bridge tars and the shard manifest that locates every sample."""

import time

import dagster as dg
from pydantic import Field

from assets.asset_policy import shard_asset
from assets.features import qwen_hidden_states, wavlm_features
from assets.reporting import column_schema, markdown_histogram, markdown_preview
from assets.shard_runs import ShardEvents, ShardResult, materialize_shards
from resources.storage import DataRootResource
from speechdata.accounting.ledgers import PRODUCT_STAGES, ledger_markdown, ledger_numbers, product_ledger, shard_ledgers
from speechdata.bridge.commit import commit_bridge, stage_bridge, staged_index
from speechdata.bridge.manifest import manifest_path
from speechdata.bridge.shard_manifest import build_shard_manifest
from speechdata.bridge.tars import DEFAULT_MAX_SAMPLES, DEFAULT_MAX_TAR_BYTES, iter_bridge_samples
from speechdata.io import layout

UI_POSITION = 4


class BridgeTarsConfig(dg.Config):
    max_tar_bytes: int = Field(DEFAULT_MAX_TAR_BYTES, description="Roll over to a new tar before passing this size.")
    max_samples: int = Field(DEFAULT_MAX_SAMPLES, description="Roll over to a new tar after this many samples.")


@shard_asset(
    deps=[qwen_hidden_states, wavlm_features],
    kinds={"webdataset"},
    code_version="bridge_tars-v5",
    checks={
        "tars_read_back_with_webdataset": "Every tar opens with the real webdataset reader, holds exactly the "
        "packed keys, and every sample's arrays agree (T and F).",
    },
)
def bridge_tars(
    context: dg.AssetExecutionContext, config: BridgeTarsConfig, data_root: DataRootResource
) -> ShardEvents:
    """The shard's bridge tuples as WebDataset tars: `bridge/<shard>-NNNNNN-<sha256 prefix>.tar`.

    One sample per utterance that passed every stage: `<key>.wav` (24 kHz mono), `<key>.qwen.npy`
    (float16 [T, 2048]), `<key>.wavlm.npy` (float16 [F, 1024]), `<key>.dur.npy`, `<key>.tokens.npy`
    (int32 [T]), `<key>.grid.npy` (int32 [F]) and `<key>.json`. Deterministic: a re-run writes
    byte-identical tars (their sha256 are in the metadata). Read with
    `speechdata.bridge.reader.bridge_dataset(urls)` or any WebDataset reader.
    """
    yield from materialize_shards(context, lambda shard_id: _pack_one_shard(context, config, data_root.get(), shard_id))


def _pack_one_shard(context: dg.AssetExecutionContext, config: BridgeTarsConfig, root, shard_id: str) -> ShardResult:
    started = time.perf_counter()
    staged = stage_bridge(
        root,
        shard_id,
        iter_bridge_samples(root, shard_id),
        max_tar_bytes=config.max_tar_bytes,
        max_samples=config.max_samples,
    )
    tars, index = staged.tars, staged.index
    seconds = time.perf_counter() - started
    total_bytes = sum(t.bytes for t in tars)
    context.log.info(
        f"{shard_id}: {index.num_rows} samples staged in {len(tars)} tars, {total_bytes / 1e6:.1f} MB"
        + ("" if tars else " (no packable utterance: an empty product)")
    )
    return ShardResult(
        metadata={
            "dagster/row_count": index.num_rows,
            "tars": len(tars),
            "bytes": total_bytes,
            "staged": not staged.problems,
            "empty_because": "" if tars else "no utterance passed every stage (see shard_manifest's ledger)",
            "megabytes_per_second": round(total_bytes / 1e6 / seconds, 2) if seconds else 0.0,
            "tar_urls": dg.MetadataValue.json({t.url: t.sha256 for t in tars}),
            "first_tar_uri": dg.MetadataValue.path(tars[0].url) if tars else "",
            "load_with": dg.MetadataValue.md(
                f"```python\nfrom speechdata.bridge.reader import bridge_dataset\n"
                f"dataset = bridge_dataset({[t.url for t in tars][:2]!r})\n```"
            ),
        },
        checks=[
            dg.AssetCheckResult(
                check_name="tars_read_back_with_webdataset",
                passed=not staged.problems,
                description=f"Shard {shard_id!r}: {len(staged.problems)} problems reading the tars back, first: "
                f"{staged.problems[0]}"
                if staged.problems
                else None,
                metadata={"problems": dg.MetadataValue.json(staged.problems[:20])},
            )
        ],
    )


@shard_asset(
    deps=[bridge_tars],
    kinds={"parquet"},
    code_version="shard_manifest-v5",
    checks={
        "every_utterance_accounted_for": "The bridge ledger balances: landed = packed + distinct rejected by "
        "the stages bridge tuples depend on (speechdata.accounting.ledgers.PRODUCT_STAGES), none in both. Checked before "
        "the manifest is committed: a shard that fails it never reaches the catalog.",
    },
)
def shard_manifest(context: dg.AssetExecutionContext, data_root: DataRootResource) -> ShardEvents:
    """One parquet row per packed sample: `manifests/shard=<shard>/part-0.parquet`.

    Columns: `key`, `shard`, `tar_url`, `offset` and `size` (the sample's byte range in its tar, so a
    reader can fetch one sample), `duration_s`, `n_frames`, `n_tokens`, `language`, `country`,
    `source`, `text`, `alignment_score`, `zero_duration_token_share`, then the landed metadata's extra
    columns. Query all shards at once through the DuckDB catalog (`manifest_catalog`).
    """
    yield from materialize_shards(context, lambda shard_id: _manifest_one_shard(data_root.get(), shard_id))


def _manifest_one_shard(root, shard_id: str) -> ShardResult:
    """Stage, check, commit: the manifest (with the staged tars) is published only when balanced."""
    staged = staged_index(root, shard_id)
    index = staged if staged is not None else root.read_parquet(layout.bridge_index(shard_id))
    manifest = build_shard_manifest(root, shard_id, index)
    ledger = product_ledger(root, shard_id, "bridge", set(manifest["key"].to_pylist()))
    if ledger.balanced:
        if staged is not None:
            commit_bridge(root, shard_id, index, manifest)
        else:
            root.write_parquet(manifest_path(shard_id), manifest)
    ledgers = {**shard_ledgers(root, shard_id), "bridge": ledger}
    hours = sum(manifest["duration_s"].to_pylist()) / 3600
    return ShardResult(
        metadata={
            "dagster/row_count": manifest.num_rows,
            "published": ledger.balanced,
            "empty_because": "" if manifest.num_rows else "no utterance passed every stage: see the ledger",
            "hours": round(hours, 6),
            "landed": ledger.landed,
            "rejected": ledger.rejected,
            "reject_share": round(ledger.rejected / ledger.landed, 6) if ledger.landed else 0.0,
            "manifest_uri": dg.MetadataValue.path(root.uri(manifest_path(shard_id))),
            "zero_duration_token_share": _zero_frame_token_share(manifest),
            "ledgers": dg.MetadataValue.md(ledger_markdown(ledgers)),
            **ledger_numbers(ledgers),
            "duration_s_histogram": markdown_histogram(manifest["duration_s"].to_pylist(), "duration_s"),
            "alignment_score_histogram": markdown_histogram(manifest["alignment_score"].to_pylist(), "alignment_score"),
            "dagster/column_schema": column_schema(manifest.schema),
            "preview": markdown_preview(
                manifest, ["key", "language", "duration_s", "n_frames", "n_tokens", "alignment_score"]
            ),
        },
        checks=[
            dg.AssetCheckResult(
                check_name="every_utterance_accounted_for",
                passed=ledger.balanced,
                description=None if ledger.balanced else _unbalanced_reason(shard_id, ledger),
                metadata={
                    "landed": ledger.landed,
                    "packed": ledger.produced,
                    "rejected": ledger.rejected,
                    "stages": dg.MetadataValue.json(list(PRODUCT_STAGES["bridge"])),
                    "unaccounted": dg.MetadataValue.json(ledger.unaccounted[:20]),
                    "packed_and_rejected": dg.MetadataValue.json(ledger.produced_and_rejected[:20]),
                },
            )
        ],
    )


def _unbalanced_reason(shard_id: str, ledger) -> str:
    """Why the bridge ledger does not balance, in one sentence: the counts and the first utterances."""
    parts = [f"Shard {shard_id!r}: {ledger.landed} landed != {ledger.produced} packed + {ledger.rejected} rejected"]
    if ledger.unaccounted:
        parts.append(f"{len(ledger.unaccounted)} neither packed nor rejected (e.g. {ledger.unaccounted[0]})")
    if ledger.produced_and_rejected:
        parts.append(f"{len(ledger.produced_and_rejected)} both (e.g. {ledger.produced_and_rejected[0]})")
    return "; ".join(parts)


def _zero_frame_token_share(manifest) -> float:
    """Share of the shard's packed tokens that own no frame (weighted by tokens, not utterances)."""
    tokens = manifest["n_tokens"].to_pylist()
    shares = manifest["zero_duration_token_share"].to_pylist()
    total = sum(tokens)
    return round(sum(n * (share or 0.0) for n, share in zip(tokens, shares, strict=True)) / total, 6) if total else 0.0


# --- the group: its definitions (assembled by dagster_project/loader.py)

defs = dg.Definitions(assets=[bridge_tars, shard_manifest])
