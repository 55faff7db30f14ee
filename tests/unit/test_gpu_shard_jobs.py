"""Every GPU asset's shard job survives the trip to a Ray actor: pickled, unpickled, same job."""

import pickle

import ray.cloudpickle as cloudpickle

from resources.aligner import CtcAlignerResource
from resources.alignment_job import alignment_shard_job
from resources.feature_jobs import feature_shard_job
from resources.qe_job import qe_shard_job
from tests.tiny_resources import tiny_resources_for


def test_every_gpu_shard_job_pickles_for_an_actor_and_keeps_its_model_key(data_root):
    resources = tiny_resources_for(data_root.url)
    jobs = {
        "qwen": feature_shard_job("qwen", data_root, resources["qwen"], resources["torch_device"]),
        "wavlm": feature_shard_job("wavlm", data_root, resources["wavlm"], resources["torch_device"]),
        "alignments": alignment_shard_job(data_root, resources["aligner"], write_ctm_files=False),
        "qe": qe_shard_job(data_root, resources["qe"], resources["torch_device"]),
    }
    assert len({job.model_key for job in jobs.values()}) == 4
    for name, job in jobs.items():
        shipped = pickle.loads(cloudpickle.dumps(job))
        assert shipped.model_key == job.model_key, name
        assert shipped.run.args[1 if name in ("qwen", "wavlm") else 0].url == data_root.url, name
    aligner = pickle.loads(cloudpickle.dumps(jobs["alignments"])).load_model()
    assert isinstance(aligner, CtcAlignerResource) and aligner.models == resources["aligner"].models


def test_a_model_setting_changes_the_model_key_so_a_worker_loads_it_anew(data_root):
    resources = tiny_resources_for(data_root.url)
    wavlm = resources["wavlm"]
    last = feature_shard_job("wavlm", data_root, wavlm, resources["torch_device"])
    layer_3 = feature_shard_job("wavlm", data_root, wavlm.model_copy(update={"layer": 3}), resources["torch_device"])
    on_cuda = feature_shard_job(
        "wavlm", data_root, wavlm, resources["torch_device"].model_copy(update={"device": "cuda:1"})
    )
    assert len({last.model_key, layer_3.model_key, on_cuda.model_key}) == 3
