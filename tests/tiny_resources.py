"""Every resource the asset groups declare, built by the groups' own factories for the tiny profile."""


def tiny_resources_for(data_root_url: str, model_cache_dir: str) -> dict:
    """Tiny models on the CPU, on the data root at ``data_root_url``."""
    from dagster_project.loader import resource_factories
    from resources.settings import ResourceSettings
    from resources.torch_device import TorchDeviceResource

    settings = ResourceSettings(data_root_url=data_root_url, profile="tiny", model_cache_dir=model_cache_dir)
    resources = {key: factory(settings) for key, factory in resource_factories().items()}
    resources["torch_device"] = TorchDeviceResource(device="cpu")
    return resources
