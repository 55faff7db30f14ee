"""A finished data root for the export tests: sample shards taken through the per-shard graph in process."""

from __future__ import annotations

import dagster as dg

from speechdata.io.storage import DataRoot


def tiny_resources_for(data_root: DataRoot, model_cache_dir: str) -> dict:
    from resources.aligner import CtcAlignerResource
    from resources.encoders import QwenEncoder, WavLMEncoder
    from resources.storage import DataRootResource
    from resources.text_tokenizer import TextTokenizerResource
    from resources.torch_device import TorchDeviceResource
    from resources.vad import SileroVadResource
    from speechdata.bridge.text_tokens import TINY_VOCAB_SIZE

    return {
        "data_root": DataRootResource(url=data_root.url),
        "aligner": CtcAlignerResource(
            models={"en": "tiny", "de": "tiny", "fr": "tiny"}, model_cache_dir=model_cache_dir
        ),
        "text_tokenizer": TextTokenizerResource(model_id="tiny"),
        "torch_device": TorchDeviceResource(device="cpu"),
        "qwen": QwenEncoder(model_id="tiny", tiny_vocab_size=TINY_VOCAB_SIZE),
        "wavlm": WavLMEncoder(model_id="tiny"),
        "vad": SileroVadResource(),
    }


def build_finished_root(data_root: DataRoot, model_cache_dir: str, shards=(("e1", 1), ("e2", 2))) -> None:
    """Land ``shards`` (id, seed) and materialize every per-shard asset for each."""
    from assets import SHARD_ASSETS
    from assets.partitions import shard_partitions
    from speechdata.testing.shards import build_sample_shard

    resources = tiny_resources_for(data_root, model_cache_dir)
    with dg.instance_for_test() as instance:
        for shard_id, seed in shards:
            build_sample_shard(data_root, shard_id, 5, seed=seed, long_recordings=1)
            instance.add_dynamic_partitions(shard_partitions.name, [shard_id])
            result = dg.materialize(SHARD_ASSETS, partition_key=shard_id, instance=instance, resources=resources)
            assert result.success
