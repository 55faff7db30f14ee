import os

import dagster as dg
from pydantic import Field

from resources.settings import ResourceSettings
from speechdata.hf.dataset import DEFAULT_DATASET, DatasetOptions
from speechdata.hf.filters import SegmentLimits
from speechdata.hf.publish import RetryPolicy
from speechdata.hf.splits import SplitTargets
from speechdata.quality.policy import QualityPolicy, default_policies


class HfDatasetSettings(dg.ConfigurableResource):
    """What the per-country Hugging Face dataset holds and how it is cut."""

    dataset: str = Field(DEFAULT_DATASET, description="Folder under hf/ and the dataset's pretty name.")
    min_duration_s: float = Field(3.0, description="Shorter segments are filtered (reason too_short).")
    max_duration_s: float = Field(20.0, description="Longer segments are filtered (reason too_long).")
    max_cer: float | None = Field(
        None, description="Segments with a higher CER are filtered (cer_above_max); None keeps all."
    )
    min_asr_confidence: float | None = Field(
        QualityPolicy.min_asr_confidence,
        description="Segments landed without text are published with the aligner's pseudo-label when its "
        "confidence reaches this (the quality policy's min_asr_confidence; the tiny profile: None, keep all); "
        "below it they are filtered (low_asr_confidence).",
    )
    test_share: float = Field(0.01, description="Target duration share of the test split (whole recordings).")
    validation_share: float = Field(0.01, description="Target duration share of the validation split.")
    split_seed: int = Field(0, description="Seeds the order in which new recordings are assigned.")
    sample_rate: int | None = Field(
        None, description="Output rate; None = the rate carrying most of the country's audio."
    )
    max_split_size_gb: float = Field(10.0, description="Size budget of one train subset (train_1, train_2...).")
    max_file_mb: float = Field(500.0, description="Parquet files roll over at this size.")
    license: str = Field("other", description="The card's license (a Hub license id: cc-by-4.0, apache-2.0, other...).")
    license_name: str | None = Field(
        None,
        description="With license 'other': the license's name, lowercase and dashed (my-license-1.0); "
        "None = the placeholder 'license-not-chosen'.",
    )
    license_link: str | None = Field(
        None, description="With license 'other': a URL or a file in the repo (LICENSE.md); None = 'LICENSE.md'."
    )
    pretty_name: str | None = Field(None, description="The card's pretty name; None = the dataset folder name.")

    def limits(self) -> SegmentLimits:
        return SegmentLimits(self.min_duration_s, self.max_duration_s, self.max_cer, self.min_asr_confidence)

    def targets(self) -> SplitTargets:
        return SplitTargets(test=self.test_share, validation=self.validation_share)

    def options(self) -> DatasetOptions:
        return DatasetOptions(
            dataset=self.dataset,
            limits=self.limits(),
            sample_rate=self.sample_rate,
            max_split_size_gb=self.max_split_size_gb,
            max_file_mb=self.max_file_mb,
        )


class HubPublisherResource(dg.ConfigurableResource):
    """Where the datasets are published on the Hugging Face Hub. Empty ``repo_id``: publishing is off.

    The token comes from the environment (``dg.EnvVar("HF_TOKEN")``); Dagster masks it and it is
    never logged.
    """

    repo_id: str = Field("", description="<org>/<dataset> on the Hub; empty turns publishing off.")
    token: str | None = Field(None, description="A write token; set it with EnvVar('HF_TOKEN').")
    endpoint: str | None = Field(None, description="Hub URL; None = huggingface.co (or HF_ENDPOINT).")
    revision: str = "main"
    private: bool = True
    retry_attempts: int = Field(
        5, description="Tries per Hub call on transient errors (429, 5xx, dropped connections)."
    )
    retry_base_delay_s: float = Field(2.0, description="First backoff delay; doubles each retry.")

    @property
    def enabled(self) -> bool:
        return bool(self.repo_id)

    def api(self):
        from huggingface_hub import HfApi

        return HfApi(endpoint=self.endpoint, token=self.token)

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(attempts=self.retry_attempts, base_delay_s=self.retry_base_delay_s)


def hub_publisher_from_env() -> HubPublisherResource:
    """``SPEECHDATA_HF_REPO_ID`` turns publishing on; ``HF_TOKEN`` is read as a masked EnvVar."""
    return HubPublisherResource(
        repo_id=os.environ.get("SPEECHDATA_HF_REPO_ID", ""),
        token=dg.EnvVar("HF_TOKEN") if os.environ.get("HF_TOKEN") else None,
        endpoint=os.environ.get("SPEECHDATA_HF_ENDPOINT") or None,
    )


def hf_dataset_settings_resource(settings: ResourceSettings) -> HfDatasetSettings:
    # The profile's quality policy decides which pseudo-labels are good enough (every preset shares the threshold).
    return HfDatasetSettings(min_asr_confidence=default_policies(settings.profile)["asr"].min_asr_confidence)


def hub_resource(settings: ResourceSettings) -> HubPublisherResource:
    return hub_publisher_from_env()
