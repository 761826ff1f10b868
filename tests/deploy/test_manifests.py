"""deploy/k8s: every kustomization builds, every object validates, and the security and drain
properties hold; Redis and Flower are started from the manifests' own commands and probed.

Schemas: Kubernetes' own (kubernetes-validate, strict: unknown fields fail) for core objects;
the KEDA and prometheus-operator CRD schemas as pydantic models (cloudcoil-models-*), checked
both ways: the model accepts the object and keeps every field of it (nothing unknown dropped).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from typing import Any

import kubernetes_validate
import promql_parser
import pytest
import redis
import yaml

from tests.support.deploy_tools import (
    DEPLOY,
    K8S,
    by_kind,
    container_env,
    kustomizations,
    kustomize,
)
from tests.support.redis_flower_checks import (
    assert_flower_requires_login,
    assert_redis_hardened,
    flower_from_command,
    on_port,
    redis_from_args,
)

# Oldest Kubernetes these manifests target (PDB policy/v1, HPA autoscaling/v2 behavior, ...) and
# the newest that kubernetes-validate knows.
K8S_VERSIONS = ["1.27.0", kubernetes_validate.utils.latest_version()]
CRD_KINDS = {"ScaledObject", "PodMonitor", "PrometheusRule"}
SECRET_VALUES = {
    "redis-password": "redispw0123456789abcdef",
    "api-keys": '["client-key-0123456789"]',
    "admin-token": "admin-token-0123456789",
    "flower-basic-auth": "ops:flower-pw-0123456789",
}
OMNISERVE_APPS = ("omniserve-gateway", "omniserve-worker", "omniserve-flower")


@pytest.fixture(scope="module")
def builds() -> dict[str, list[dict[str, Any]]]:
    return {str(d.relative_to(K8S)): kustomize(d) for d in kustomizations()}


@pytest.fixture(scope="module")
def base(builds: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return builds["keda"]  # the base plus the ScaledObject


def deployment(objs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return by_kind(objs, "Deployment")[name]


def pod(objs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return deployment(objs, name)["spec"]["template"]["spec"]


def config(objs: list[dict[str, Any]]) -> dict[str, str]:
    return by_kind(objs, "ConfigMap")["omniserve-config"]["data"]


def env_of(objs: list[dict[str, Any]], name: str) -> dict[str, str]:
    return container_env(pod(objs, name)["containers"][0], config(objs), SECRET_VALUES)


# ------------------------------------------------------------------------------- schemas
def test_the_expected_kustomizations_exist(builds: dict[str, list[dict[str, Any]]]) -> None:
    assert {".", "base", "keda", "monitoring", "examples/recordings-s3"} <= set(builds)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schema(
    builds: dict[str, list[dict[str, Any]]], version: str
) -> None:
    unchecked = set()
    for where, objs in builds.items():
        for obj in objs:
            if obj["kind"] in CRD_KINDS:
                unchecked.add(obj["kind"])
                continue
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                pytest.fail(
                    f"{where}: {obj['kind']}/{obj['metadata']['name']} {path}: {exc.message}"
                )
    assert unchecked == CRD_KINDS  # each is checked against its CRD schema below


def test_strict_validation_rejects_an_unknown_field(base: list[dict[str, Any]]) -> None:
    """The validator bites: a misspelt field fails (it would be dropped silently by a cluster)."""
    broken = json.loads(json.dumps(deployment(base, "omniserve-gateway")))
    spec = broken["spec"]["template"]["spec"]
    spec["terminationGracePeriodSecond"] = spec.pop("terminationGracePeriodSeconds")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[0], strict=True)


def round_trip(model: Any, obj: dict[str, Any]) -> None:
    """The CRD model accepts the object and drops nothing (an unknown field would vanish)."""
    parsed = model.model_validate(obj)
    assert parsed.model_dump(by_alias=True, exclude_unset=True, mode="json") == obj


def test_keda_scaled_object_matches_the_crd_and_queries_the_contract(
    base: list[dict[str, Any]],
) -> None:
    from cloudcoil.models.keda.v1alpha1 import ScaledObject

    so = by_kind(base, "ScaledObject")["omniserve-worker"]
    round_trip(ScaledObject, so)
    spec = so["spec"]
    assert spec["scaleTargetRef"]["name"] in by_kind(base, "Deployment")
    assert spec["scaleTargetRef"]["name"] == "omniserve-worker"
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    queries = []
    for trig in spec["triggers"]:
        assert trig["type"] == "prometheus"
        assert trig["metricType"] in {"AverageValue", "Value"}  # the HPA target types KEDA takes
        meta = trig["metadata"]
        assert {"serverAddress", "query", "threshold"} <= set(meta)
        assert set(meta) <= {"serverAddress", "query", "threshold", "activationThreshold"}
        float(meta["threshold"])
        promql_parser.parse(meta["query"])  # raises on a syntax error
        queries.append(re.sub(r"\s+", "", meta["query"]))
    # the two signals of the contract: the global queue (max over gateways) and busy slots
    assert any("max(omniserve_queue_waiting)" in q for q in queries)
    assert 'sum(omniserve_worker_slots{state="busy"})/sum(omniserve_worker_slots)' in queries


def test_prometheus_operator_objects_match_their_crds(
    builds: dict[str, list[dict[str, Any]]],
) -> None:
    from cloudcoil.models.prometheus_operator.v1 import PodMonitor, PrometheusRule

    objs = builds["monitoring"]
    monitors = by_kind(objs, "PodMonitor")
    for m in monitors.values():
        round_trip(PodMonitor, m)
    gw = monitors["omniserve-gateway"]["spec"]["podMetricsEndpoints"][0]
    assert gw["authorization"]["credentials"] == {"name": "omniserve-secrets", "key": "admin-token"}
    rule = by_kind(objs, "PrometheusRule")["omniserve"]
    round_trip(PrometheusRule, rule)
    alerts = yaml.safe_load((DEPLOY / "prometheus" / "omniserve-alerts.yml").read_text())
    assert rule["spec"] == alerts  # one set of alerts for compose and Kubernetes
    # the monitors select the pods by the labels and port names the Deployments use
    base = builds["base"]
    for app, port in (("omniserve-gateway", "http"), ("omniserve-worker", "metrics")):
        sel = monitors[app]["spec"]["selector"]["matchLabels"]
        labels = deployment(base, app)["spec"]["template"]["metadata"]["labels"]
        assert sel.items() <= labels.items()
        ports = {p["name"] for c in pod(base, app)["containers"] for p in c.get("ports", [])}
        assert ports == {port}
        assert monitors[app]["spec"]["podMetricsEndpoints"][0]["port"] == port


# -------------------------------------------------------------------------------- secrets
def test_secrets_come_from_the_secret_the_readme_tells_operators_to_create(
    base: list[dict[str, Any]],
) -> None:
    refs = set()
    for dep in by_kind(base, "Deployment").values():
        for c in dep["spec"]["template"]["spec"]["containers"]:
            for item in c.get("env", []):
                if "valueFrom" in item:
                    ref = item["valueFrom"]["secretKeyRef"]
                    refs.add((ref["name"], ref["key"]))
    assert {name for name, _ in refs} == {"omniserve-secrets"}
    readme = (DEPLOY / "README.md").read_text()
    command = re.search(r"kubectl create secret generic omniserve-secrets(.*?)```", readme, re.S)
    assert command, "deploy/README.md must show how to create the Secret"
    documented = set(re.findall(r"--from-(?:literal|file)=([a-z-]+)=", command.group(1)))
    assert documented == {key for _, key in refs} == set(SECRET_VALUES)
    assert not by_kind(base, "Secret")  # never committed with values
    assert "OMNISERVE_API_KEYS" not in config(base)
    assert "OMNISERVE_ADMIN_TOKEN" not in config(base)


def test_only_the_gateway_holds_the_api_keys_and_admin_token(base: list[dict[str, Any]]) -> None:
    for app in ("omniserve-worker", "omniserve-flower", "omniserve-redis"):
        names = {e["name"] for c in pod(base, app)["containers"] for e in c.get("env", [])}
        assert not names & {"OMNISERVE_API_KEYS", "OMNISERVE_ADMIN_TOKEN"}, app
    env = env_of(base, "omniserve-gateway")
    assert env["OMNISERVE_API_KEYS"] == SECRET_VALUES["api-keys"]
    assert env["OMNISERVE_ADMIN_TOKEN"] == SECRET_VALUES["admin-token"]


# ---------------------------------------------------------------------------------- redis
def test_redis_runs_with_password_and_memory_cap_and_omniserve_pods_reach_it(
    base: list[dict[str, Any]],
) -> None:
    spec = pod(base, "omniserve-redis")
    c = spec["containers"][0]
    env = container_env(c, {}, SECRET_VALUES)
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in c["args"]]
    limit = c["resources"]["limits"]["memory"]
    assert limit.endswith("Gi")
    with redis_from_args(args) as port:
        assert_redis_hardened(port, SECRET_VALUES["redis-password"], int(limit[:-2]) * 2**30)
        for app in OMNISERVE_APPS:
            url = env_of(base, app)["OMNISERVE_REDIS_URL"]
            assert urlsplit_host(url) == "omniserve-redis:6379", url
            assert redis.Redis.from_url(on_port(url, port), socket_timeout=5).ping(), app
    assert "REDISCLI_AUTH" in env  # the probes' redis-cli authenticates
    services = by_kind(base, "Service")
    assert services["omniserve-redis"]["spec"]["type"] == "ClusterIP"


def urlsplit_host(url: str) -> str:
    return url.split("@", 1)[-1].split("/", 1)[0]


def test_redis_admits_only_omniserve_pods(base: list[dict[str, Any]]) -> None:
    policy = by_kind(base, "NetworkPolicy")["omniserve-redis"]["spec"]
    redis_labels = deployment(base, "omniserve-redis")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= redis_labels.items()
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}  # no namespaceSelector / ipBlock: this namespace only
    (expr,) = peer["podSelector"]["matchExpressions"]
    assert expr["key"] == "app.kubernetes.io/name" and expr["operator"] == "In"
    users = {
        name
        for name in by_kind(base, "Deployment")
        if name != "omniserve-redis" and "OMNISERVE_REDIS_URL" in env_of(base, name)
    }
    assert set(expr["values"]) == users == set(OMNISERVE_APPS)


# --------------------------------------------------------------------------------- flower
def test_flower_is_internal_and_asks_for_its_login(base: list[dict[str, Any]]) -> None:
    for svc in by_kind(base, "Service").values():
        assert svc["spec"].get("type", "ClusterIP") == "ClusterIP", svc["metadata"]["name"]
    assert not by_kind(base, "Ingress")
    policy = by_kind(base, "NetworkPolicy")["omniserve-flower"]["spec"]
    assert policy["ingress"][0]["from"] == [{"podSelector": {}}]  # this namespace only
    c = pod(base, "omniserve-flower")["containers"][0]
    env = env_of(base, "omniserve-flower")
    assert env["FLOWER_BASIC_AUTH"] == SECRET_VALUES["flower-basic-auth"]
    with redis_from_args(
        ["redis-server", "--requirepass", SECRET_VALUES["redis-password"]]
    ) as port:
        env["OMNISERVE_REDIS_URL"] = on_port(env["OMNISERVE_REDIS_URL"], port)
        with flower_from_command(c["command"], env) as url:
            assert_flower_requires_login(url, SECRET_VALUES["flower-basic-auth"])


# ----------------------------------------------------------------------- drain and scaling
def prestop_seconds(container: dict[str, Any]) -> int:
    hook = container.get("lifecycle", {}).get("preStop")
    if not hook:
        return 0
    cmd = hook["exec"]["command"]
    assert cmd[0] == "sleep", cmd
    return int(cmd[1])


@pytest.mark.parametrize("app", ["omniserve-gateway", "omniserve-worker"])
def test_pods_get_time_to_drain_and_leave_one_at_a_time(
    base: list[dict[str, Any]], app: str
) -> None:
    drain = float(config(base)["OMNISERVE_DRAIN_GRACE_S"])
    dep = deployment(base, app)
    spec = dep["spec"]["template"]["spec"]
    grace = spec["terminationGracePeriodSeconds"]
    assert grace >= prestop_seconds(spec["containers"][0]) + drain + 30, (grace, drain)
    assert dep["spec"]["progressDeadlineSeconds"] > grace
    assert "replicas" not in dep["spec"]  # owned by the autoscaler
    pdbs = [
        p
        for p in by_kind(base, "PodDisruptionBudget").values()
        if p["spec"]["selector"]["matchLabels"].items()
        <= dep["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert len(pdbs) == 1 and pdbs[0]["spec"]["maxUnavailable"] == 1


def test_gateways_pause_before_draining_and_scale_on_cpu(base: list[dict[str, Any]]) -> None:
    assert prestop_seconds(pod(base, "omniserve-gateway")["containers"][0]) >= 5
    hpa = by_kind(base, "HorizontalPodAutoscaler")["omniserve-gateway"]["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "omniserve-gateway",
    }
    assert hpa["minReplicas"] >= 2
    (metric,) = hpa["metrics"]
    assert metric["resource"]["name"] == "cpu"
    assert "cpu" in pod(base, "omniserve-gateway")["containers"][0]["resources"]["requests"]


# ------------------------------------------------------------------------- settings, mounts
@pytest.mark.parametrize("app", OMNISERVE_APPS)
def test_pod_environment_parses_as_omniserve_settings(
    base: list[dict[str, Any]], app: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from omnicore.settings import Settings

    env = env_of(base, app)
    for key in list(os.environ):
        if key.startswith("OMNISERVE_") or key == "REDIS_URL":
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.redis_url == env["OMNISERVE_REDIS_URL"]


def test_gateway_security_settings_are_well_formed(base: list[dict[str, Any]]) -> None:
    env = env_of(base, "omniserve-gateway")
    for cidr in json.loads(env["OMNISERVE_TRUSTED_PROXIES"]):
        ipaddress.ip_network(cidr)
    origins = json.loads(env["OMNISERVE_ALLOWED_ORIGINS"])
    assert origins and all(o.startswith("https://") for o in origins)
    assert int(env["OMNISERVE_MAX_CONNECTIONS_PER_CLIENT"]) > 0
    assert env["OMNISERVE_RECORDINGS"] == "true"
    assert json.loads(env["OMNISERVE_API_KEYS"])


def mounts(objs: list[dict[str, Any]], app: str) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in pod(objs, app)["containers"][0].get("volumeMounts", [])}


def test_voices_are_read_only_and_recordings_writable(base: list[dict[str, Any]]) -> None:
    voices = config(base)["OMNISERVE_VOICES_DIR"]
    for app in ("omniserve-gateway", "omniserve-worker"):
        assert mounts(base, app)[voices].get("readOnly") is True, app
    rec = config(base)["OMNISERVE_RECORDINGS_URL"]
    assert not mounts(base, "omniserve-gateway")[rec].get("readOnly")
    volumes = {v["name"]: v for v in pod(base, "omniserve-gateway")["volumes"]}
    claim = volumes[mounts(base, "omniserve-gateway")[rec]["name"]]["persistentVolumeClaim"]
    pvc = by_kind(base, "PersistentVolumeClaim")[claim["claimName"]]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]  # every gateway writes there


def test_s3_recordings_example_drops_the_volume(builds: dict[str, list[dict[str, Any]]]) -> None:
    objs = builds["examples/recordings-s3"]
    assert config(objs)["OMNISERVE_RECORDINGS_URL"].startswith("s3://")
    assert "/recordings" not in mounts(objs, "omniserve-gateway")
    assert "omniserve-recordings" not in by_kind(objs, "PersistentVolumeClaim")


def test_worker_metrics_port_matches_the_setting(base: list[dict[str, Any]]) -> None:
    port = int(config(base)["OMNISERVE_WORKER_METRICS_PORT"])
    ports = {
        p["name"]: p["containerPort"]
        for p in pod(base, "omniserve-worker")["containers"][0]["ports"]
    }
    assert ports == {"metrics": port}


@pytest.mark.parametrize(
    "app", ["omniserve-gateway", "omniserve-worker", "omniserve-flower", "omniserve-redis"]
)
def test_pods_run_unprivileged_without_service_links(base: list[dict[str, Any]], app: str) -> None:
    spec = pod(base, app)
    assert spec["enableServiceLinks"] is False  # OMNISERVE_GATEWAY_PORT=tcp://... otherwise
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    for c in spec["containers"]:
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
