"""A GPU worker keeps each model loaded once, reads the next shard ahead and re-reads stale inputs."""

import threading
import weakref

import pytest

from resources.gpu_worker import ShardJob, ShardWorker
from resources.gpu_workers import GpuWorkersResource, gpu_workers_resource
from resources.settings import ResourceSettings


class Recorder:
    """A job whose model is a counter and whose inputs are versioned strings."""

    def __init__(self):
        self.loads = 0
        self.reads: list[tuple[str, str]] = []
        self.version = {"a": 1, "b": 1, "c": 1}
        self.lock = threading.Lock()

    def load(self):
        self.loads += 1
        return {"loaded": self.loads}

    def read(self, shard_id):
        with self.lock:
            self.reads.append((shard_id, threading.current_thread().name))
            return (shard_id, self.version[shard_id])

    def current(self, inputs):
        shard_id, version = inputs
        return self.version[shard_id] == version

    def run(self, model, shard_id, inputs, on_progress):
        return {"model": model, "shard": shard_id, "inputs": inputs}

    def job(self, model_key="m"):
        return ShardJob(model_key, self.load, self.read, self.current, self.run)


def test_a_worker_loads_each_model_key_once_and_serves_every_shard_with_it():
    recorder, worker = Recorder(), ShardWorker("w")
    outcomes = [worker.run_shard(recorder.job(), s) for s in ("a", "b", "c")]
    assert recorder.loads == 1 and [o.result["model"] for o in outcomes] == [{"loaded": 1}] * 3
    assert outcomes[0].model_load_s >= 0 and [o.model_load_s for o in outcomes[1:]] == [0.0, 0.0]
    assert all(o.model_loads == 1 for o in outcomes)
    worker.run_shard(recorder.job("other settings"), "a")
    assert recorder.loads == 2 and worker.describe()["model_loads"] == {"m": 1, "other settings": 1}


def test_the_next_shard_is_read_ahead_while_the_current_one_runs():
    recorder, worker = Recorder(), ShardWorker("w")
    first = worker.run_shard(recorder.job(), "a", next_shard_id="b")
    second = worker.run_shard(recorder.job(), "b", next_shard_id=None)
    assert not first.inputs_read_ahead and second.inputs_read_ahead
    assert second.result["inputs"] == ("b", 1)
    [(_, reader)] = [r for r in recorder.reads if r[0] == "b"]
    assert reader.startswith("read-ahead-")  # read on the worker's thread, once


def test_inputs_rewritten_after_the_read_ahead_are_read_again():
    recorder, worker = Recorder(), ShardWorker("w")
    worker.run_shard(recorder.job(), "a", next_shard_id="b")
    recorder.version["b"] = 2  # frame grids of b replaced between the read-ahead and its turn
    second = worker.run_shard(recorder.job(), "b")
    assert not second.inputs_read_ahead and second.result["inputs"] == ("b", 2)


def test_a_read_ahead_for_another_shard_is_not_used():
    recorder, worker = Recorder(), ShardWorker("w")
    worker.run_shard(recorder.job(), "a", next_shard_id="b")
    outcome = worker.run_shard(recorder.job(), "c")
    assert not outcome.inputs_read_ahead and outcome.result["inputs"] == ("c", 1)


def test_the_engine_comes_from_the_environment_and_a_typo_names_the_variable():
    settings = ResourceSettings(data_root_url="/tmp/x", profile="tiny", model_cache_dir="/tmp/m")
    assert gpu_workers_resource(settings, environ={}).engine == "local"
    ray = gpu_workers_resource(
        settings,
        environ={
            "SPEECHDATA_GPU_ENGINE": "ray",
            "SPEECHDATA_RAY_ADDRESS": "ray://head:10001",
            "SPEECHDATA_GPU_WORKERS_PER_GPU": "2",
            "SPEECHDATA_GPU_MAX_RESIDENT_MODELS": "2",
        },
    )
    assert (ray.engine, ray.ray_address, ray.gpu_share_per_worker) == ("ray", "ray://head:10001", 0.5)
    assert ray.max_resident_models == 2 and gpu_workers_resource(settings, environ={}).max_resident_models == 4
    with pytest.raises(ValueError, match="SPEECHDATA_GPU_ENGINE='rya'"):
        gpu_workers_resource(settings, environ={"SPEECHDATA_GPU_ENGINE": "rya"})
    with pytest.raises(ValueError, match="exclusive"):
        _ = GpuWorkersResource(engine="ray", workers_per_gpu=2, gpus_per_worker=2.0).gpu_share_per_worker


def test_a_worker_keeps_no_shard_inputs_once_the_shard_that_used_them_is_done():
    import gc
    import weakref

    class Inputs:
        def __init__(self, shard_id):
            self.shard_id = shard_id

    read: dict[str, weakref.ref] = {}

    def read_inputs(shard_id):
        inputs = Inputs(shard_id)
        read[shard_id] = weakref.ref(inputs)
        return inputs

    job = ShardJob("m", dict, read_inputs, lambda inputs: True, lambda model, shard_id, inputs, progress: shard_id)
    worker = ShardWorker("w")
    worker.run_shard(job, "a", next_shard_id="b")
    assert worker.run_shard(job, "b").inputs_read_ahead
    gc.collect()
    assert read["a"]() is None and read["b"]() is None  # an idle resident worker holds no decoded audio


class Model:
    """A loaded model: weak-referenceable, so a test sees when the worker let go of it."""

    def __init__(self, key):
        self.key = key


def loading(key, loaded: list, fail_first_with: type[Exception] | None = None) -> ShardJob:
    attempts = []

    def load():
        attempts.append(key)
        if fail_first_with is not None and len(attempts) == 1:
            raise fail_first_with("CUDA out of memory. Tried to allocate 2.00 GiB")
        model = Model(key)
        loaded.append(weakref.ref(model))
        return model

    return ShardJob(key, load, lambda shard_id: None, lambda inputs: True, lambda model, *_: model.key)


def test_a_model_key_beyond_the_bound_evicts_the_least_recently_used_model_and_frees_it():
    worker, loaded = ShardWorker("w", max_resident_models=2), []
    for key in ("qwen", "wavlm", "qwen", "qwen@new-revision"):  # qwen used again: wavlm is the oldest
        assert worker.run_shard(loading(key, loaded), "a").result == key
    state = worker.describe()
    assert state["models"] == ["qwen", "qwen@new-revision"] and state["model_evictions"] == {"wavlm": 1}
    assert [ref() is None for ref in loaded] == [False, True, False]  # the evicted model is gone
    outcome = worker.run_shard(loading("wavlm", loaded), "b")  # back: loaded again, evicting qwen
    assert outcome.model_loads == 2 and outcome.model_load_s > 0
    assert worker.describe()["models"] == ["qwen@new-revision", "wavlm"]


def test_a_load_out_of_device_memory_frees_the_other_models_and_loads_once_more():
    class OutOfMemoryError(RuntimeError):  # torch.cuda.OutOfMemoryError's name
        pass

    worker, loaded = ShardWorker("w"), []
    worker.run_shard(loading("aligner", loaded), "a")
    worker.run_shard(loading("metricx", loaded), "a")
    assert worker.run_shard(loading("qwen", loaded, fail_first_with=OutOfMemoryError), "a").result == "qwen"
    assert worker.describe()["models"] == ["qwen"] and [ref() is None for ref in loaded] == [True, True, False]
    with pytest.raises(OutOfMemoryError):  # nothing left to free: the error stands
        ShardWorker("alone").run_shard(loading("qwen", [], fail_first_with=OutOfMemoryError), "a")
    with pytest.raises(ValueError, match="at least one model"):
        ShardWorker("w", max_resident_models=0)
