"""deploy/: the Helm values, the two dagster.yaml files and the Dockerfile say what the code needs.

The Dagster chart's JSON schema is not published in any package registry (it lives in the chart), so
the values are linted as YAML (duplicate keys are errors) and every key path is checked against the
keys the chart documents (its values.yaml and schema models, for the 1.13 line), listed below.
"""

import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

# Key paths the Dagster chart documents ("[]" = a list item, "*" = free-form Kubernetes objects below).
DOCUMENTED_KEYS = {
    "global",
    "global.postgresqlSecretName",
    "global.dagsterHome",
    "global.serviceAccountName",
    "global.celeryConfigSecretName",
    "dagsterWebserver",
    "dagsterWebserver.replicaCount",
    "dagsterWebserver.image",
    "dagsterWebserver.image.repository",
    "dagsterWebserver.image.tag",
    "dagsterWebserver.image.pullPolicy",
    "dagsterWebserver.env",
    "dagsterWebserver.env[]",
    "dagsterWebserver.env[].name",
    "dagsterWebserver.env[].value",
    "dagsterWebserver.volumes",
    "dagsterWebserver.volumes[].*",
    "dagsterWebserver.volumeMounts",
    "dagsterWebserver.volumeMounts[].*",
    "dagsterWebserver.podSecurityContext.*",
    "dagsterWebserver.resources.*",
    "dagster-user-deployments",
    "dagster-user-deployments.enabled",
    "dagster-user-deployments.enableSubchart",
    "dagster-user-deployments.imagePullSecrets",
    "dagster-user-deployments.deployments",
    "dagster-user-deployments.deployments[]",
    *(
        f"dagster-user-deployments.deployments[].{key}"
        for key in (
            "name",
            "image",
            "image.repository",
            "image.tag",
            "image.pullPolicy",
            "dagsterApiGrpcArgs",
            "codeServerArgs",
            "includeConfigInLaunchedRuns",
            "includeConfigInLaunchedRuns.enabled",
            "port",
            "env",
            "env[]",
            "env[].name",
            "env[].value",
            "envConfigMaps",
            "envConfigMaps[]",
            "envConfigMaps[].name",
            "envSecrets",
            "envSecrets[]",
            "envSecrets[].name",
            "annotations",
            "nodeSelector",
            "affinity",
            "tolerations",
            "podSecurityContext",
            "securityContext",
            "resources.*",
            "livenessProbe",
            "readinessProbe",
            "startupProbe",
            "labels",
            "volumeMounts",
            "volumes",
            "schedulerName",
        )
    ),
    "runLauncher",
    "runLauncher.type",
    "runLauncher.config",
    "runLauncher.config.k8sRunLauncher",
    *(
        f"runLauncher.config.k8sRunLauncher.{key}"
        for key in (
            "image",
            "imagePullPolicy",
            "jobNamespace",
            "loadInclusterConfig",
            "kubeconfigFile",
            "envConfigMaps",
            "envConfigMaps[]",
            "envConfigMaps[].name",
            "envSecrets",
            "envSecrets[]",
            "envSecrets[].name",
            "envVars",
            "volumeMounts",
            "volumes",
            "labels",
            "failPodOnRunFailure",
            "resources.*",
            "schedulerName",
            "securityContext",
            "runK8sConfig",
            "runK8sConfig.containerConfig.*",
            "runK8sConfig.podSpecConfig.*",
            "runK8sConfig.podTemplateSpecMetadata.*",
            "runK8sConfig.jobSpecConfig.*",
            "runK8sConfig.jobMetadata.*",
        )
    ),
    "postgresql",
    *(
        f"postgresql.{key}"
        for key in (
            "enabled",
            "image",
            "postgresqlHost",
            "postgresqlUsername",
            "postgresqlPassword",
            "postgresqlDatabase",
            "postgresqlParams",
            "postgresqlScheme",
            "service",
            "service.port",
        )
    ),
    "generatePostgresqlPasswordSecret",
    "dagsterDaemon",
    *(
        f"dagsterDaemon.{key}"
        for key in (
            "enabled",
            "image",
            "image.repository",
            "image.tag",
            "image.pullPolicy",
            "env",
            "env[]",
            "env[].name",
            "env[].value",
            "volumes",
            "volumes[].*",
            "volumeMounts",
            "volumeMounts[].*",
            "heartbeatTolerance",
            "runCoordinator",
            "runCoordinator.enabled",
            "runCoordinator.type",
            "runCoordinator.config",
            "runCoordinator.config.queuedRunCoordinator",
            "runCoordinator.config.queuedRunCoordinator.maxConcurrentRuns",
            "runCoordinator.config.queuedRunCoordinator.tagConcurrencyLimits",
            "runCoordinator.config.queuedRunCoordinator.dequeueIntervalSeconds",
            "runCoordinator.config.queuedRunCoordinator.dequeueNumWorkers",
            "runCoordinator.config.queuedRunCoordinator.dequeueUseThreads",
            "sensors",
            "sensors.useThreads",
            "sensors.numWorkers",
            "sensors.numSubmitWorkers",
            "schedules",
            "schedules.useThreads",
            "schedules.numWorkers",
            "runMonitoring.*",
            "runRetries.*",
            "resources.*",
            "nodeSelector",
            "tolerations",
            "affinity",
        )
    ),
    "concurrency",
    "concurrency.enabled",
    "concurrency.pools",
    "concurrency.pools.defaultLimit",
    "concurrency.pools.granularity",
    "concurrency.pools.opGranularityRunBuffer",
    "concurrency.runs",
    "concurrency.runs.maxConcurrentRuns",
    "concurrency.runs.tagConcurrencyLimits",
    "concurrency.runs.tagConcurrencyLimits[]",
    "concurrency.runs.tagConcurrencyLimits[].key",
    "concurrency.runs.tagConcurrencyLimits[].value",
    "concurrency.runs.tagConcurrencyLimits[].value.applyLimitPerUniqueValue",
    "concurrency.runs.tagConcurrencyLimits[].limit",
    "telemetry",
    "telemetry.enabled",
    "retention.*",
    "computeLogManager.*",
    "pythonLogs.*",
    "serviceAccount.*",
    "imagePullSecrets",
    "ingress.*",
    "migrate.*",
    "additionalInstanceConfig.*",
}


class StrictLoader(yaml.SafeLoader):
    """YAML that refuses a key twice in one mapping (PyYAML would keep the last silently)."""


def _strict_mapping(loader, node, deep=False):
    keys = [loader.construct_object(key, deep=deep) for key, _ in node.value]
    duplicates = {k for k in keys if keys.count(k) > 1}
    if duplicates:
        raise yaml.constructor.ConstructorError(None, None, f"duplicate keys {sorted(duplicates)}", node.start_mark)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _strict_mapping)


def load(path: Path):
    return yaml.load(path.read_text(), Loader=StrictLoader)


def key_paths(value, prefix: str = ""):
    if isinstance(value, dict):
        for key, child in value.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            yield path
            yield from key_paths(child, path)
    elif isinstance(value, list):
        for child in value:
            yield from key_paths(child, f"{prefix}[]")


def documented(path: str) -> bool:
    if path in DOCUMENTED_KEYS or f"{path}.*" in DOCUMENTED_KEYS:
        return True
    parts = path.split(".")
    return any(".".join(parts[:i]) + ".*" in DOCUMENTED_KEYS for i in range(1, len(parts)))


@pytest.fixture(scope="module")
def values():
    return load(DEPLOY / "helm" / "values.yaml")


def test_helm_values_use_only_keys_the_chart_documents(values):
    unknown = [path for path in key_paths(values) if not documented(path)]
    assert unknown == []
    assert not documented("dagster-user-deployments.deployments[].gpu")  # the check itself can fail


def test_helm_values_deploy_our_code_location_on_k8s_with_postgres_and_the_gpu_pool(values):
    [deployment] = values["dagster-user-deployments"]["deployments"]
    args = deployment["dagsterApiGrpcArgs"]
    assert args[0] == "-m" and (ROOT / Path(*args[1].split("."))).with_suffix(".py").is_file()
    env = {item["name"]: item["value"] for item in deployment["env"]}
    assert env["SPEECHDATA_EXECUTOR"] == "k8s" and env["DATA_ROOT"].startswith("s3://")
    assert int(env["SPEECHDATA_MAX_CONCURRENT_STEPS"]) > 0 and "=" in env["SPEECHDATA_GPU_NODE_SELECTOR"]
    assert deployment["includeConfigInLaunchedRuns"]["enabled"] is True
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    assert (
        values["postgresql"]["enabled"] is False and values["postgresql"]["postgresqlScheme"] == "postgresql+psycopg2"
    )
    concurrency = values["concurrency"]
    assert concurrency["enabled"] is True and concurrency["pools"]["granularity"] == "op"
    assert concurrency["pools"]["defaultLimit"] >= 1 and concurrency["runs"]["maxConcurrentRuns"] >= 1
    # The chart fails when the run queue is limited in both places.
    queued = values["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]
    assert "maxConcurrentRuns" not in queued and "tagConcurrencyLimits" not in queued
    # The one-writer-per-country limit holds everywhere; the local file's extra "one country run at a
    # time" is for a single machine and stays out of the cluster.
    local = load(DEPLOY / "local" / "dagster.yaml")["concurrency"]["runs"]["tag_concurrency_limits"]
    per_country = {"key": "speechdata/hf_country", "value": {"applyLimitPerUniqueValue": True}, "limit": 1}
    assert per_country in local and concurrency["runs"]["tagConcurrencyLimits"] == [per_country]


def test_local_and_production_instances_differ_only_in_storage_and_production_is_valid():
    from dagster._core.instance.config import dagster_instance_config

    local = load(DEPLOY / "local" / "dagster.yaml")
    production = load(DEPLOY / "production" / "dagster.yaml")
    # Both on the caching storages: Dagster's SQLite (default layout) and PostgreSQL storages.
    assert local["storage"]["custom"]["class"] == "CachingSqliteStorage"
    assert local["storage"]["custom"]["config"] == {"base_dir": {"env": "DAGSTER_HOME"}}
    assert production["storage"]["custom"]["class"] == "CachingPostgresStorage"
    assert set(production["storage"]["custom"]["config"]) == {"postgres_db"}
    assert local["storage"]["custom"]["module"] == production["storage"]["custom"]["module"]
    assert {k: v for k, v in production.items() if k != "storage"} == {k: v for k, v in local.items() if k != "storage"}
    for folder in ("local", "production"):
        config, _ = dagster_instance_config(str(DEPLOY / folder))  # Dagster's own schema check
        assert config["concurrency"]["pools"]["granularity"] == "op"


def test_the_image_is_cuda_based_and_carries_every_package_and_httpfs():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=nvidia/cuda:" in dockerfile and "FROM ${BASE_IMAGE}" in dockerfile
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    for package in packages:
        name = package.rstrip("*")
        assert f"COPY {name} ./{name}" in dockerfile, name
    assert "INSTALL httpfs" in dockerfile and "python install 3.11" in dockerfile.replace("${PYTHON_VERSION}", "3.11")
    assert '"-m", "dagster_project.definitions"' in dockerfile
