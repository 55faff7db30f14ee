import dagster as dg

from resources.settings import ResourceSettings
from speechdata.profiles import Profile


class ModelProfileResource(dg.ConfigurableResource):
    """Which models the model resources load: ``full`` (production) or ``tiny`` (demo, tests, CI).

    Set from ``SPEECHDATA_PROFILE``. ``tiny`` builds small randomly initialised models of the same
    classes locally, so its embeddings are not meaningful.
    """

    profile: Profile = "full"


def model_profile_resource(settings: ResourceSettings) -> ModelProfileResource:
    return ModelProfileResource(profile=settings.profile)
