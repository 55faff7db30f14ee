"""On Kubernetes: the pod each step would get, built by dagster-k8s's own functions without a cluster,
and the executor switch that picks the k8s_job_executor."""

import json
import types

import dagster as dg
import pytest
from dagster_k8s import k8s_job_executor
from dagster_k8s.container_context import K8sContainerContext
from dagster_k8s.job import UserDefinedDagsterK8sConfig, construct_dagster_k8s_job, get_user_defined_k8s_config

from assets.gpu_pool import DEFAULT_GPU_NODE_SELECTOR, gpu_node_selector, gpu_op_tags
from dagster_project.definitions import defs
from dagster_project.execution import executor_from_env, k8s_executor_config, max_concurrent_steps
from tests import spec_snapshot

K8S = {"SPEECHDATA_EXECUTOR": "k8s"}
GPU_STEPS = set(spec_snapshot.gpu_asset_keys())

# What the Helm-deployed K8sRunLauncher hands a step (K8sContainerContext.get_k8s_job_config reads these).
HELM_RUN_LAUNCHER = types.SimpleNamespace(
    job_image=None,
    dagster_home="/opt/dagster/dagster_home",
    instance_config_map="speech-data-dagster-instance",
    postgres_password_secret="dagster-postgresql-secret",
)


def step_pod_spec(op_tags: dict, executor_config: dict):
    """The V1PodSpec of a step's Job, merged exactly as ``K8sStepHandler`` merges it: the executor's
    container context (its ``step_k8s_config``), then the op's ``dagster-k8s/config`` tag."""
    context = K8sContainerContext(
        namespace="speech", run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(executor_config["step_k8s_config"])
    ).merge(K8sContainerContext(run_k8s_config=get_user_defined_k8s_config(op_tags)))
    job_config = context.get_k8s_job_config("registry.example.com/speech-data-platform:0.1.0", HELM_RUN_LAUNCHER)
    job = construct_dagster_k8s_job(
        job_config=job_config,
        args=["dagster", "api", "execute_step"],
        job_name="dagster-step-test",
        pod_name="dagster-step-test",
        component="step_worker",
        user_defined_k8s_config=context.run_k8s_config,
    )
    return job.spec.template.spec


def shard_steps() -> dict[str, dict]:
    """Every step of the shard jobs with its op tags as the code location defines them."""
    steps = {}
    for job_name in ("per_shard_job", "translation_job"):
        for node in defs.resolve_job_def(job_name).graph.nodes:
            steps[node.name] = dict(node.definition.tags)
    return steps


def test_gpu_steps_request_one_gpu_on_gpu_nodes_and_cpu_steps_none():
    steps = shard_steps()
    assert set(steps) >= GPU_STEPS and len(steps) > len(GPU_STEPS)
    config = k8s_executor_config(K8S)
    for name, tags in steps.items():
        spec = step_pod_spec(tags, config)
        [container] = spec.containers
        limits, requests = container.resources.limits, container.resources.requests
        # Every step pod has the executor's CPU and memory requests; the GPU tag adds to them.
        assert requests["cpu"] == "1" and requests["memory"] == "4Gi" and limits["memory"] == "16Gi", name
        if name in GPU_STEPS:
            assert limits["nvidia.com/gpu"] == "1" and requests["nvidia.com/gpu"] == "1", name
            assert spec.node_selector == {"nvidia.com/gpu.present": "true"}, name
            assert [(t.key, t.operator, t.effect) for t in spec.tolerations] == [
                ("nvidia.com/gpu", "Exists", "NoSchedule")
            ]
        else:
            assert "nvidia.com/gpu" not in limits and "nvidia.com/gpu" not in requests, name
            assert not spec.node_selector and not spec.tolerations, name
        assert container.image == "registry.example.com/speech-data-platform:0.1.0"


def test_the_gpu_node_selector_is_configurable_per_cluster():
    gke = gpu_node_selector("cloud.google.com/gke-accelerator=nvidia-h100-80gb")
    spec = step_pod_spec(
        {"dagster-k8s/config": json.dumps(gpu_op_tags(gke)["dagster-k8s/config"])}, k8s_executor_config(K8S)
    )
    assert spec.node_selector == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert gpu_node_selector(DEFAULT_GPU_NODE_SELECTOR) == {"nvidia.com/gpu.present": "true"}
    with pytest.raises(ValueError, match="key=value"):
        gpu_node_selector("nvidia.com/gpu.present")


def test_the_executor_switch_picks_in_process_a_capped_multiprocess_executor_or_the_k8s_job_executor():
    assert executor_from_env({}).name == "in_process"
    assert defs.resolve_job_def("per_shard_job").executor_def.name == "in_process"
    local = executor_from_env({"SPEECHDATA_EXECUTOR": "multiprocess"})
    assert local.name == "multiprocess_capped" and 1 <= max_concurrent_steps({}) <= 4
    assert max_concurrent_steps({"SPEECHDATA_MAX_CONCURRENT_STEPS": "3"}) == 3
    with pytest.raises(ValueError):
        executor_from_env({"SPEECHDATA_EXECUTOR": "celery"})

    on_k8s = executor_from_env(K8S)
    assert on_k8s.name == "k8s_job_executor"
    k8s_defs = dg.Definitions(assets=defs.assets, jobs=defs.jobs, resources=defs.resources, executor=on_k8s)
    assert k8s_defs.resolve_job_def("per_shard_job").executor_def.name == "k8s_job_executor"

    # The executor config is valid for dagster-k8s's own schema.
    @dg.op
    def noop():
        pass

    @dg.job(executor_def=k8s_job_executor)
    def probe():
        noop()

    validated = dg.validate_run_config(probe, {"execution": {"config": k8s_executor_config(K8S)}})
    step_pod = validated["execution"]["k8s"]
    assert step_pod["max_concurrent"] == 16 and step_pod["step_k8s_config"]["container_config"]["resources"]["requests"]
    with pytest.raises(dg.DagsterInvalidConfigError):
        dg.validate_run_config(probe, {"execution": {"config": {"max_concurent": 16}}})
