"""The Kubernetes instance: deploy/helm/dagster.yaml, read by the webserver and the daemon instead of
the Helm chart's own instance ConfigMap (which cannot name a custom storage); run and step pods get
the launching process's instance from dagster-k8s. The chart cannot be rendered here (no helm, no
network to its repository), so the values and the file are checked against each other, Dagster's
and dagster-k8s's own config schemas, and a PostgreSQL server started here."""

import pytest
import yaml

from tests.integration.test_deploy_files import DEPLOY, load


@pytest.fixture(scope="module")
def values():
    return load(DEPLOY / "helm" / "values.yaml")


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
