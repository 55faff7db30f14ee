"""deploy/: the Helm values, the three dagster.yaml files and the Dockerfile say what the code needs.

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


# The Kubernetes instance: deploy/helm/dagster.yaml, read by the webserver and the daemon instead of
# the chart's own instance ConfigMap (which cannot name a custom storage); run and step pods get the
# launching process's instance from dagster-k8s.


@pytest.fixture(scope="module")
def helm_instance():
    return load(DEPLOY / "helm" / "dagster.yaml")


def env_of(component: dict) -> dict:
    return {item["name"]: item["value"] for item in component.get("env", [])}


def test_helm_webserver_and_daemon_run_our_image_and_read_the_caching_instance(values, helm_instance):
    [deployment] = values["dagster-user-deployments"]["deployments"]
    launcher = helm_instance["run_launcher"]["config"]
    config_map = launcher["instance_config_map"]
    for name in ("dagsterWebserver", "dagsterDaemon"):
        component = values[name]
        # Dagster's own images cannot import dagster_project.instance_storage.
        assert component.get("image") == deployment["image"], name
        home = env_of(component).get("DAGSTER_HOME")
        assert home and home != "/opt/dagster/dagster_home", name  # not where the chart mounts its file
        [volume] = [v for v in component.get("volumes", []) if v.get("configMap", {}).get("name") == config_map]
        [mount] = [m for m in component.get("volumeMounts", []) if m["name"] == volume["name"]]
        assert mount["mountPath"] == f"{home}/dagster.yaml" and mount["subPath"] == "dagster.yaml", name
    # Run pods get DAGSTER_HOME from the run launcher (the daemon's): a directory the image creates
    # for the pods' user.
    assert launcher["dagster_home"] == {"env": "DAGSTER_HOME"} and launcher["instance_config_map"] == config_map
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    [chown] = [line for line in dockerfile.splitlines() if "chown" in line]
    assert home in chown.split() and f"mkdir -p ${{DAGSTER_HOME}} {home} " in dockerfile
    # Our image's user is unprivileged; the chart's webserver listens on port 80 (its default).
    assert "\nUSER dagster\n" in dockerfile
    webserver_port = values["dagsterWebserver"].get("service", {}).get("port", 80)
    sysctls = values["dagsterWebserver"].get("podSecurityContext", {}).get("sysctls", [])
    unprivileged_from = {s["name"]: int(s["value"]) for s in sysctls}.get("net.ipv4.ip_unprivileged_port_start", 1024)
    assert webserver_port >= unprivileged_from
    # What the run launcher names is what the chart creates or is given.
    assert launcher["service_account_name"] == values["global"]["serviceAccountName"]
    assert launcher["postgres_password_secret"] == values["global"]["postgresqlSecretName"]
    chart_launcher = values["runLauncher"]["config"]["k8sRunLauncher"]
    assert launcher["env_secrets"] == [secret["name"] for secret in chart_launcher["envSecrets"]]


def test_helm_instance_is_the_caching_postgres_storage_on_the_charts_postgresql(values, helm_instance):
    from dagster._core.instance.config import dagster_instance_config
    from dagster._core.storage.base_storage import DagsterStorage
    from dagster._serdes.config_class import class_from_code_pointer

    storage = helm_instance["storage"]["custom"]
    production = load(DEPLOY / "production" / "dagster.yaml")["storage"]["custom"]
    assert (storage["module"], storage["class"]) == (production["module"], production["class"])
    assert (storage["module"], storage["class"]) == ("dagster_project.instance_storage", "CachingPostgresStorage")
    assert issubclass(class_from_code_pointer(storage["module"], storage["class"]), DagsterStorage)
    # The database the chart's values name (its check-db-ready init container waits for it), with the
    # password the chart puts in DAGSTER_PG_PASSWORD from global.postgresqlSecretName.
    postgresql = values["postgresql"]
    assert storage["config"] == {
        "postgres_db": {
            "hostname": postgresql["postgresqlHost"],
            "port": postgresql["service"]["port"],
            "username": postgresql["postgresqlUsername"],
            "password": {"env": "DAGSTER_PG_PASSWORD"},
            "db_name": postgresql["postgresqlDatabase"],
            "scheme": postgresql["postgresqlScheme"],
        }
    }
    assert set(storage["config"]["postgres_db"]) == set(production["config"]["postgres_db"])
    config, _ = dagster_instance_config(str(DEPLOY / "helm"))  # Dagster's own schema check
    assert config["storage"]["custom"]["class"] == "CachingPostgresStorage"


def test_helm_instance_keeps_every_setting_the_chart_values_give(values, helm_instance):
    chart_runs = values["concurrency"]["runs"]
    chart_pools = values["concurrency"]["pools"]
    assert helm_instance["concurrency"] == {
        "runs": {
            "max_concurrent_runs": chart_runs["maxConcurrentRuns"],
            "tag_concurrency_limits": chart_runs["tagConcurrencyLimits"],
        },
        "pools": {"granularity": chart_pools["granularity"], "default_limit": chart_pools["defaultLimit"]},
    }
    daemon = values["dagsterDaemon"]
    queued = daemon["runCoordinator"]["config"]["queuedRunCoordinator"]
    coordinator = helm_instance["run_coordinator"]
    assert coordinator["class"] == daemon["runCoordinator"]["type"] == "QueuedRunCoordinator"
    assert coordinator["config"] == {
        "dequeue_use_threads": queued["dequeueUseThreads"],
        "dequeue_num_workers": queued["dequeueNumWorkers"],
    }
    assert helm_instance["sensors"] == {
        "use_threads": daemon["sensors"]["useThreads"],
        "num_workers": daemon["sensors"]["numWorkers"],
    }
    assert helm_instance["run_monitoring"]["enabled"] is daemon["runMonitoring"]["enabled"] is True
    assert helm_instance["telemetry"] == values["telemetry"]
    chart_launcher = values["runLauncher"]["config"]["k8sRunLauncher"]
    launcher = helm_instance["run_launcher"]
    assert launcher["class"] == values["runLauncher"]["type"]
    assert launcher["config"]["load_incluster_config"] is chart_launcher["loadInclusterConfig"]
    assert launcher["config"]["image_pull_policy"] == chart_launcher["imagePullPolicy"]
    run_config = launcher["config"]["run_k8s_config"]
    chart_run_config = chart_launcher["runK8sConfig"]
    assert run_config["container_config"] == chart_run_config["containerConfig"]
    assert (
        run_config["job_spec_config"]["ttl_seconds_after_finished"]
        == chart_run_config["jobSpecConfig"]["ttlSecondsAfterFinished"]
    )


def test_helm_instance_run_launcher_config_is_what_dagster_k8s_accepts(helm_instance, monkeypatch):
    from dagster._config import process_config
    from dagster_k8s import K8sRunLauncher

    # The variables the chart sets on the daemon and the webserver.
    monkeypatch.setenv("DAGSTER_HOME", "/opt/dagster/instance")
    monkeypatch.setenv("DAGSTER_K8S_PIPELINE_RUN_NAMESPACE", "speech")
    monkeypatch.setenv("DAGSTER_K8S_PIPELINE_RUN_ENV_CONFIGMAP", "speech-data-dagster-pipeline-env")
    launcher = helm_instance["run_launcher"]
    assert launcher["module"] == "dagster_k8s"
    result = process_config(K8sRunLauncher.config_type(), launcher["config"])
    assert result.success, result.errors
    assert result.value["dagster_home"] == "/opt/dagster/instance"
    assert result.value["job_namespace"] == "speech"
    assert result.value["env_config_maps"] == ["speech-data-dagster-pipeline-env"]


def test_helm_instance_builds_the_caching_postgres_storage_here_and_in_run_pods(helm_instance, tmp_path, monkeypatch):
    """The file as deployed, on a PostgreSQL server started here: only the connection's address and
    user are this server's (the storage connects when it is built). A run or step pod builds its
    storage from the serialized reference of the launching process's instance, as done here."""
    from dagster._core.instance.ref import InstanceRef
    from dagster._serdes import deserialize_value, serialize_value

    from dagster_project.instance_storage import CachingPostgresEventLogStorage, CachingPostgresStorage
    from tests.e2e.postgres_server import PostgresServer

    with PostgresServer() as server:
        local = server.postgres_db
        instance = dict(helm_instance)
        postgres_db = dict(instance["storage"]["custom"]["config"]["postgres_db"])
        for key in ("hostname", "port", "username", "db_name"):
            postgres_db[key] = local[key]
        instance["storage"] = {"custom": {**instance["storage"]["custom"], "config": {"postgres_db": postgres_db}}}
        home = tmp_path / "instance"
        home.mkdir()
        (home / "dagster.yaml").write_text(yaml.safe_dump(instance))
        monkeypatch.setenv("DAGSTER_PG_PASSWORD", local["password"])
        daemon_ref = InstanceRef.from_dir(str(home))
        assert "DAGSTER_PG_PASSWORD" in daemon_ref.storage_data.config_yaml  # read in the pod, not sent
        storage = deserialize_value(serialize_value(daemon_ref), InstanceRef).storage
        try:
            assert isinstance(storage, CachingPostgresStorage)
            events = storage.event_log_storage
            assert isinstance(events, CachingPostgresEventLogStorage)
            events.add_dynamic_partitions("shard", ["shard-0001", "shard-0002"])
            for _ in range(5):
                assert events.get_dynamic_partitions("shard") == ["shard-0001", "shard-0002"]
            assert events.dynamic_partitions_full_reads == 1
        finally:
            for part in (storage.run_storage, storage.event_log_storage, storage.schedule_storage):
                part.dispose()
