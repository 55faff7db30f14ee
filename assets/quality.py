"""[quality] Per-utterance quality signals and the per-product decisions the product stages apply."""

import dagster as dg
from pydantic import Field

from assets.alignment import alignments
from assets.asset_policy import shard_asset
from assets.ingest import normalized_audio
from assets.near_duplicates import near_duplicates
from assets.reporting import column_schema, markdown_histogram, markdown_rows, stage_metadata
from assets.shard_runs import ShardEvents, ShardResult, load_model_for_step, materialize_shards
from resources.profile import ModelProfileResource
from resources.quality import QualityModelsResource
from resources.storage import DataRootResource
from resources.torch_device import TorchDeviceResource
from resources.vad import SileroVadResource
from speechdata.io import layout
from speechdata.quality.paths import quality_decisions as decisions_path
from speechdata.quality.paths import quality_signals as signals_path
from speechdata.quality.policy import PRESETS, QualityPolicy, default_policies, policies_digest
from speechdata.quality.schema import QUALITY_SIGNALS_SCHEMA
from speechdata.quality.stage import run_quality_decisions, run_quality_signals

UI_POSITION = 25

SIGNAL_HISTOGRAMS = {
    "bandwidth_hz": "Hz",
    "snr_db": "dB",
    "level_dbfs": "dBFS",
    "clipped_share": "share",
    "silence_share": "share",
    "speech_share": "share",
    "leading_silence_s": "s",
    "trailing_silence_s": "s",
    "text_language_confidence": "probability",
    "cer": "CER",
    "wer": "WER",
    "asr_confidence": "probability",
    "audio_language_confidence": "probability",
    "mos": "MOS",
    "speech_snr_db": "dB",
    "dc_offset_ratio": "mean/RMS",
    "mains_hum_share": "share",
    "chars_per_s": "letters/s",
    "words_per_s": "words/s",
    "ngram_repetition": "share",
    "duration_s": "s",
    "dnsmos_sig": "MOS",
    "dnsmos_bak": "MOS",
    "dnsmos_ovrl": "MOS",
}
"""The signals whose per-shard distribution the asset's metadata shows (one markdown histogram each)."""


@shard_asset(
    deps=[normalized_audio, alignments],
    kinds={"pytorch", "parquet"},
    code_version="quality_signals-v5",
    checks={"one_row_per_indexed_utterance": "quality.parquet has exactly one row per utterance of the index."},
    gpu=True,
)
def quality_signals(
    context: dg.AssetExecutionContext,
    data_root: DataRootResource,
    vad: SileroVadResource,
    quality_models: QualityModelsResource,
    torch_device: TorchDeviceResource,
) -> ShardEvents:
    """Every utterance's quality signals, the evidence behind each product's quality filters.

    File: `shards/<shard>/quality.parquet`, one row per indexed utterance: bandwidth, clipping, level,
    WADA-SNR and a VAD-based SNR, DC offset and mains hum, Silero speech share and edge silences,
    speaking rate, transcript repetition, text-LID and audio-LID languages, the aligner's greedy
    transcript with its CER/WER against the landed text, a MOS estimate and DNSMOS (docs/quality.md).
    """
    root = data_root.get()
    models, load_s = load_model_for_step(
        context,
        quality_models.identity,
        lambda: (
            vad.model(),
            quality_models.audio_language(torch_device),
            quality_models.speech_quality(torch_device),
            quality_models.dnsmos(),
        ),
    )
    vad_model, audio_language, speech_quality, dnsmos = models
    speakers = quality_models.speaker_encoder(torch_device)  # shipped in its wheel, loaded once per process

    def one_shard(shard_id: str) -> ShardResult:
        summary = run_quality_signals(
            root,
            shard_id,
            vad_model=vad_model,
            vad_params=vad.params(),
            audio_language=audio_language,
            speech_quality=speech_quality,
            dnsmos=dnsmos,
            speakers=speakers,
        )
        table = root.read_parquet(signals_path(shard_id))
        indexed = root.read_parquet(layout.utterance_index(shard_id), columns=["utt_id"]).num_rows
        return ShardResult(
            metadata={
                **stage_metadata(summary),
                "model": quality_models.identity,
                "model_load_seconds": round(load_s, 3),
                "dagster/column_schema": column_schema(
                    QUALITY_SIGNALS_SCHEMA,
                    {f.name: f.metadata[b"description"].decode() for f in QUALITY_SIGNALS_SCHEMA},
                ),
                **{
                    f"histogram/{column}": markdown_histogram(table[column].to_pylist(), unit)
                    for column, unit in SIGNAL_HISTOGRAMS.items()
                },
            },
            checks=[
                dg.AssetCheckResult(
                    check_name="one_row_per_indexed_utterance",
                    passed=table.num_rows == indexed,
                    metadata={"rows": table.num_rows, "indexed": indexed},
                )
            ],
        )

    yield from materialize_shards(context, one_shard)


class ProductPolicyConfig(dg.Config):
    """Changes to one product's preset (docs/quality.md lists every threshold and its default)."""

    thresholds: dict[str, float] = Field(
        default_factory=dict, description="Threshold name -> value, replacing the preset's (e.g. max_cer: 0.4)."
    )
    disabled: list[str] = Field(default_factory=list, description="Filters turned off, by reason (e.g. narrowband).")


class QualityPolicyConfig(dg.Config):
    """The quality policy: each product's preset, as the model profile applies it, with these changes."""

    bridge: ProductPolicyConfig = Field(default_factory=ProductPolicyConfig)
    asr: ProductPolicyConfig = Field(default_factory=ProductPolicyConfig)
    translation: ProductPolicyConfig = Field(default_factory=ProductPolicyConfig)

    def policies(self, profile: str) -> dict[str, QualityPolicy]:
        presets = default_policies(profile)
        return {
            product: presets[product].with_overrides(change.thresholds, change.disabled)
            for product, change in (("bridge", self.bridge), ("asr", self.asr), ("translation", self.translation))
        }


# The presets' digest is in the code version: a changed default re-decides every shard. A policy
# given as run config changes the data version, which marks the product stages downstream stale.
@shard_asset(
    deps=[quality_signals, near_duplicates],
    kinds={"parquet"},
    code_version=f"quality_decisions-v2+{policies_digest(PRESETS)}",
)
def quality_decisions(
    context: dg.AssetExecutionContext,
    config: QualityPolicyConfig,
    data_root: DataRootResource,
    model_profile: ModelProfileResource,
) -> ShardEvents:
    """Which utterances each product (bridge, ASR, translation) leaves out for quality, and why.

    File: `shards/<shard>/quality_decisions.parquet`, one row per measured utterance and product:
    `reason` null (kept) or the quality reject reason, `detail` (the value and the limit of every failed
    filter), `keep_start_s`/`keep_end_s` (the span kept when edge silence is trimmed), `policy_sha256`. The product stages read it through
    `speechdata.quality.decisions.excluded_utterances` and record each left-out utterance as a reject.
    """
    root = data_root.get()
    policies = config.policies(model_profile.profile)
    digest = policies_digest(policies)

    def one_shard(shard_id: str) -> ShardResult:
        summary = run_quality_decisions(root, shard_id, policies)
        table = root.read_parquet(decisions_path(shard_id), columns=["product", "reason"])
        counts: dict[tuple[str, str], int] = {}
        for product, reason in zip(table["product"].to_pylist(), table["reason"].to_pylist(), strict=True):
            key = (product, reason or "kept")
            counts[key] = counts.get(key, 0) + 1
        return ShardResult(
            metadata={
                **stage_metadata(summary),
                "policy_sha256": digest,
                "policy": dg.MetadataValue.json({p: vars(policy) for p, policy in policies.items()}),
                "decisions": markdown_rows(
                    [{"product": p, "decision": r, "utterances": n} for (p, r), n in sorted(counts.items())]
                ),
            }
        )

    yield from materialize_shards(context, one_shard, data_version=digest)


defs = dg.Definitions(assets=[quality_signals, quality_decisions])
