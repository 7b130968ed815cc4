"""deploy/k8s: every manifest parses, is listed by the kustomization, and wires the daemon correctly
(config, token, probes, scrape annotations, grace period, non-root, Spark Connect address)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from lakemirror.daemon.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KUSTOMIZATION: dict[str, Any] = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
DOCS: list[dict[str, Any]] = [doc for name in KUSTOMIZATION["resources"]
                              for doc in yaml.safe_load_all((K8S / name).read_text(encoding="utf-8")) if doc]


def one(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in DOCS if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    [c] = deployment["spec"]["template"]["spec"]["containers"]
    return dict(c)


def port_number(c: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    [number] = [p["containerPort"] for p in c["ports"] if p["name"] == port]
    return int(number)


DAEMON = one("Deployment", "lakemirror")
CONNECT = one("Deployment", "lakemirror-spark-connect")
CONFIG_MAP = one("ConfigMap", "lakemirror-pipeline")


@pytest.fixture
def pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The ConfigMap's pipeline.yaml, loaded as the daemon loads it (with the Secret's variable set)."""
    monkeypatch.setenv("LAKEMIRROR_HTTP__AUTH_TOKEN", "t0ken")
    path = tmp_path / "pipeline.yaml"
    path.write_text(CONFIG_MAP["data"]["pipeline.yaml"], encoding="utf-8")
    return load_settings(path)


def test_the_kustomization_lists_every_manifest_and_pins_the_image() -> None:
    assert KUSTOMIZATION["kind"] == "Kustomization"
    manifests = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(KUSTOMIZATION["resources"]) == manifests
    assert KUSTOMIZATION["namespace"] == "lakemirror"
    for image in KUSTOMIZATION["images"]:
        assert image.get("newTag") not in (None, "", "latest")
    for doc in DOCS:
        assert {"apiVersion", "kind", "metadata"} <= set(doc), doc
    for dep in (DAEMON, CONNECT):
        image = container(dep)["image"]
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", image) and not image.endswith(":latest"), image


def test_the_configmap_pipeline_is_valid_and_runs_through_spark_connect(pipeline: Settings) -> None:
    assert pipeline.runtime.mode == "connect"
    assert pipeline.http.auth_token is not None and pipeline.http.auth_token.get_secret_value() == "t0ken"
    service = one("Service", "lakemirror-spark-connect")
    [port] = service["spec"]["ports"]
    assert pipeline.runtime.spark_remote == f"sc://{service['metadata']['name']}:{port['port']}"
    assert port_number(container(CONNECT), port["targetPort"]) == 15002
    assert "spark.connect.grpc.binding.port=15002" in container(CONNECT)["args"]
    # the daemon listens on all interfaces, on the port its probes and annotations use
    assert pipeline.http.host == "0.0.0.0" and pipeline.http.port == port_number(container(DAEMON), "http")


def test_the_daemon_reads_the_configmap_and_the_token_from_the_secret() -> None:
    c = container(DAEMON)
    pod = DAEMON["spec"]["template"]["spec"]
    [mount] = [m for m in c["volumeMounts"] if m["mountPath"] == "/etc/lakemirror"]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == CONFIG_MAP["metadata"]["name"]
    assert c["args"] == ["run", "/etc/lakemirror/pipeline.yaml"]
    [token] = [e for e in c["env"] if e["name"] == "LAKEMIRROR_HTTP__AUTH_TOKEN"]
    ref = token["valueFrom"]["secretKeyRef"]
    secret = one("Secret", ref["name"])
    assert ref["key"] in secret.get("stringData", {}) or ref["key"] in secret.get("data", {})
    assert not any("auth_token" in line for line in CONFIG_MAP["data"]["pipeline.yaml"].splitlines()
                   if not line.lstrip().startswith("#")), "the token belongs in the Secret, not the ConfigMap"


def test_probes_and_prometheus_annotations(pipeline: Settings) -> None:
    c = container(DAEMON)
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("livenessProbe", "readinessProbe"):
        assert port_number(c, c[probe]["httpGet"]["port"]) == 9464 == pipeline.http.port
    annotations = DAEMON["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(pipeline.http.port)
    assert annotations["prometheus.io/path"] == "/metrics"


def test_the_grace_period_outlasts_the_drain(pipeline: Settings) -> None:
    """The daemon lives at most drain_timeout_seconds + EXIT_GRACE_SECONDS after SIGTERM; docs/operations.md
    asks a process manager for 5 s more (the JVM's own exit)."""
    from lakemirror.daemon.drain import EXIT_GRACE_SECONDS

    grace = DAEMON["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= pipeline.drain_timeout_seconds + EXIT_GRACE_SECONDS + 5, (
        f"terminationGracePeriodSeconds {grace} must be at least drain_timeout_seconds "
        f"{pipeline.drain_timeout_seconds} + {EXIT_GRACE_SECONDS + 5:g}")


def test_one_daemon_at_a_time() -> None:
    assert DAEMON["spec"]["replicas"] == 1
    assert DAEMON["spec"]["strategy"]["type"] == "Recreate", "a rolling update would run two daemons at once"


@pytest.mark.parametrize("deployment", [DAEMON, CONNECT], ids=["daemon", "spark-connect"])
def test_pods_run_as_non_root(deployment: dict[str, Any]) -> None:
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    for c in pod["containers"]:
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]


@pytest.mark.parametrize("deployment", [DAEMON, CONNECT], ids=["daemon", "spark-connect"])
def test_selectors_mounts_and_claims_are_consistent(deployment: dict[str, Any]) -> None:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    services = [d for d in DOCS if d["kind"] == "Service" and d["spec"]["selector"].items() <= labels.items()]
    assert len(services) == 1, "one Service selects the pods"
    pod = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for c in pod["containers"]:
        for m in c["volumeMounts"]:
            assert m["name"] in volumes, f"mount of an undefined volume {m['name']}"
    for v in volumes.values():
        if "persistentVolumeClaim" in v:
            one("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"])


def test_the_connect_server_loads_delta_and_can_import_lakemirror(pipeline: Settings) -> None:
    c = container(CONNECT)
    args = c["args"]
    assert args[:2] == ["--class", "org.apache.spark.sql.connect.service.SparkConnectServer"]
    for conf in ("spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension",
                 "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog",
                 f"spark.sql.warehouse.dir={pipeline.runtime.warehouse}"):
        assert conf in args, conf
    # No Delta Connect plugin: Maven Central does not serve it, and lakemirror needs none (SQL only).
    assert not [a for a in args if "spark.connect.extensions" in a or "delta.connect" in a.lower()], args
    # Delta's jars come from the image's cache, on the driver's class path.
    assert args[args.index("--driver-class-path") + 1] == "/opt/lakemirror/jars/*"
    assert {"name": "PYSPARK_PYTHON", "value": "/opt/lakemirror/venv/bin/python"} in c["env"]
    # the server and the daemon see the same lakehouse and checkpoints at the same paths
    for dep in (DAEMON, CONNECT):
        mounts = {m["mountPath"] for m in container(dep)["volumeMounts"]}
        assert "/data" in mounts
    assert pipeline.checkpoint_volume.startswith("/data/") and pipeline.runtime.warehouse.startswith("/data/")


def test_the_connect_server_is_tuned_as_the_local_one() -> None:
    """The server in the cluster schedules tables' queries fairly and rebuilds Delta's snapshots in
    a few tasks, as scripts/connect-server.sh (which the Connect tests and benchmarks start) does."""
    script = (ROOT / "scripts" / "connect-server.sh").read_text()
    args = container(CONNECT)["args"]
    for key in ("spark.scheduler.mode", "spark.databricks.delta.snapshotPartitions"):
        local = re.search(rf"--conf {re.escape(key)}=(\S+)", script)
        assert local is not None, f"scripts/connect-server.sh no longer sets {key}"
        assert f"{key}={local.group(1)}" in args, f"deploy/k8s/spark-connect.yaml should set {key}={local.group(1)}"
    partitions = [a for a in args if a.startswith("spark.sql.shuffle.partitions=")]
    assert partitions and int(partitions[0].split("=", 1)[1]) <= 8, "a few shuffle partitions per small batch"
