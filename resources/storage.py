import dagster as dg
from pydantic import PrivateAttr

from resources.settings import ResourceSettings
from speechdata.io.storage import DataRoot


class DataRootResource(dg.ConfigurableResource):
    """The fsspec data root every product lives under (``DATA_ROOT``: a path, ``s3://``, ``gs://``...).

    Writes through it are atomic (temp name, then rename); paths come from ``speechdata.io.layout``.
    """

    url: str

    _data_root: DataRoot | None = PrivateAttr(default=None)

    def get(self) -> DataRoot:
        if self._data_root is None:
            self._data_root = DataRoot(self.url)
        return self._data_root


def data_root_resource(settings: ResourceSettings) -> DataRootResource:
    return DataRootResource(url=settings.data_root_url)
