"""The one entry point: every asset, check, job, sensor and resource of the code location."""

from pathlib import Path

import dagster as dg
from dagster_duckdb import DuckDBResource

from assets import ALL_ASSETS
from dagster_project.execution import executor_from_env
from dagster_project.jobs import ALL_JOBS
from dagster_project.settings import PROJECT_ROOT, data_root_url, model_profile
from resources.aligner import DEFAULT_ALIGNMENT_MODELS, CtcAlignerResource
from resources.encoders import QwenEncoder, WavLMEncoder
from resources.hub import HfDatasetSettings, hub_publisher_from_env
from resources.model_pins import QWEN, WAVLM
from resources.profile import ModelProfileResource
from resources.qe import MetricXResource
from resources.storage import DataRootResource
from resources.text_tokenizer import TextTokenizerResource
from resources.torch_device import TorchDeviceResource
from resources.vad import SileroVadResource
from sensors.catalog import catalog_refresh_sensor
from sensors.landing import landing_sensor
from sensors.publishing import country_dataset_sensor
from speechdata.bridge.text_tokens import TINY_VOCAB_SIZE

TINY_ALIGNMENT_LANGUAGES = ("en", "de", "fr")
"""The tiny CTC model's character set covers these; other sample languages show the no-model reject."""


def build_resources(data_root: str | None = None, profile: str | None = None) -> dict:
    profile = profile or model_profile()
    tiny = profile == "tiny"
    cache_dir = str(PROJECT_ROOT / ".cache" / "models")
    return {
        "data_root": DataRootResource(url=data_root or data_root_url()),
        "model_profile": ModelProfileResource(profile=profile),
        "aligner": CtcAlignerResource(
            models={language: "tiny" for language in TINY_ALIGNMENT_LANGUAGES}
            if tiny
            else dict(DEFAULT_ALIGNMENT_MODELS),
            model_cache_dir=cache_dir,
        ),
        "text_tokenizer": TextTokenizerResource(
            model_id="tiny" if tiny else QWEN.model_id, revision=None if tiny else QWEN.revision
        ),
        "torch_device": TorchDeviceResource(),
        "qwen": QwenEncoder(
            model_id="tiny" if tiny else QWEN.model_id,
            revision=None if tiny else QWEN.revision,
            tiny_vocab_size=TINY_VOCAB_SIZE,
        ),
        "wavlm": WavLMEncoder(model_id="tiny" if tiny else WAVLM.model_id, revision=None if tiny else WAVLM.revision),
        "qe": MetricXResource(
            model_path="tiny" if tiny else "google/metricx-24-hybrid-xl-v2p6", model_cache_dir=cache_dir
        ),
        "vad": SileroVadResource(),
        "catalog": DuckDBResource(database=catalog_database_path(data_root or data_root_url())),
        "hf_dataset_settings": HfDatasetSettings(),
        "hub": hub_publisher_from_env(),
    }


def catalog_database_path(root_url: str) -> str:
    """The catalog DuckDB file the `catalog` resource opens: the root's own file on a local root; on an
    object store a local working copy (DuckDB writes only local files) that `manifest_catalog` uploads."""
    import hashlib
    import tempfile

    from speechdata.catalog.views import CATALOG_FILE, duckdb_location
    from speechdata.io.storage import DataRoot

    if DataRoot(root_url).is_local:
        return f"{duckdb_location(root_url).rstrip('/')}/{CATALOG_FILE}"
    digest = hashlib.sha1(root_url.encode()).hexdigest()[:16]
    return str(Path(tempfile.gettempdir()) / "speechdata-catalog" / digest / CATALOG_FILE)


defs = dg.Definitions(
    assets=ALL_ASSETS,
    jobs=ALL_JOBS,
    sensors=[landing_sensor, catalog_refresh_sensor, country_dataset_sensor],
    resources=build_resources(),
    executor=executor_from_env(),
)
