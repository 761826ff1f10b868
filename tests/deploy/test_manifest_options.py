"""deploy/k8s/examples/rabbitmq (RabbitMQ as Celery's broker) and examples/redis-cluster (the
shared state on a Redis Cluster of 3 primaries and 3 replicas), and the autoscaler's reading of
the waiting room whatever the shared state is.

The objects build and validate with the rest (tests/deploy/test_manifests.py); here each
omniserve pod's environment is read as its settings, RabbitMQ is started with the example's own
settings file and login, and the cluster's nodes from the StatefulSet's arguments, made one
cluster as the init Job makes it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any
from urllib.parse import urlsplit

import pytest

from streaming.broker_url import broker_target, unreachable
from tests.support.cluster_create import FORMED_WITHIN_S, create_cluster
from tests.support.deploy_tools import (
    DEPLOY,
    K8S,
    by_kind,
    container_env,
    kustomize,
    redis7_server,
)
from tests.support.deployed_settings import settings_of
from tests.support.rabbitmq import RabbitMQ
from tests.support.redis_flower_checks import on_port, redis_from_args
from tests.support.services import running

SECRETS = {
    "omniserve-secrets": {
        "redis-password": "redispw0123456789abcdef",
        "api-keys": '["client-key-0123456789"]',
        "admin-token": "admin-token-0123456789",
        "flower-basic-auth": "ops:flower-pw-0123456789",
    },
    "omniserve-rabbitmq": {"password": "rabbitpw0123456789abcdef"},
}
APPS = ("omniserve-gateway", "omniserve-worker", "omniserve-flower")


def secret_refs_resolved(container: dict[str, Any]) -> dict[str, Any]:
    """The container with each secretKeyRef's Secret name folded into its key (the helper reads
    one flat key -> value map)."""
    out = dict(container)
    out["env"] = []
    for item in container.get("env", []):
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            item = {
                "name": item["name"],
                "valueFrom": {"secretKeyRef": {"key": f"{ref['name']}/{ref['key']}"}},
            }
        out["env"].append(item)
    return out


FLAT = {f"{name}/{key}": value for name, keys in SECRETS.items() for key, value in keys.items()}


def env_of(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, str]:
    obj = by_kind(objs, kind)[name]
    container = obj["spec"]["template"]["spec"]["containers"][0]
    config = by_kind(objs, "ConfigMap")["omniserve-config"]["data"]
    return container_env(secret_refs_resolved(container), config, FLAT)


def admitted(policy: dict[str, Any], port: int) -> set[str]:
    """The app names a NetworkPolicy admits on ``port``."""
    names: set[str] = set()
    for rule in policy["spec"]["ingress"]:
        if {"protocol": "TCP", "port": port} not in rule["ports"]:
            continue
        for peer in rule["from"]:
            sel = peer["podSelector"]
            names |= set(sel.get("matchLabels", {}).values())
            for expr in sel.get("matchExpressions", []):
                names |= set(expr["values"])
    return names


# ------------------------------------------------------------------------------- RabbitMQ
@pytest.fixture(scope="module")
def rabbit_objs() -> list[dict[str, Any]]:
    return kustomize(K8S / "examples" / "rabbitmq")


def test_every_part_takes_rabbitmq_as_its_broker(
    rabbit_objs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    for app in APPS:
        s = settings_of(env_of(rabbit_objs, "Deployment", app), monkeypatch)
        assert s.separate_broker and broker_target(s.broker).kind == "amqp", app
        assert urlsplit(s.broker).hostname == "omniserve-rabbitmq", app
        assert urlsplit(s.broker).password == SECRETS["omniserve-rabbitmq"]["password"], app
        assert s.redis_url.startswith("redis://"), app  # the sessions stay on Redis
    policy = by_kind(rabbit_objs, "NetworkPolicy")["omniserve-rabbitmq"]
    assert admitted(policy, 5672) == set(APPS)


def test_rabbitmq_is_one_stateful_node_with_the_deployments_settings(
    rabbit_objs: list[dict[str, Any]],
) -> None:
    sts = by_kind(rabbit_objs, "StatefulSet")["omniserve-rabbitmq"]
    assert sts["spec"]["replicas"] == 1 and sts["spec"]["volumeClaimTemplates"]
    conf = by_kind(rabbit_objs, "ConfigMap")["omniserve-rabbitmq"]["data"]["90-omniserve.conf"]
    assert conf == (DEPLOY / "rabbitmq" / "rabbitmq.conf").read_text()  # one settings file
    pod = sts["spec"]["template"]["spec"]
    mount = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}["config"]
    assert mount["mountPath"].startswith("/etc/rabbitmq/conf.d/") and mount["readOnly"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    service = by_kind(rabbit_objs, "Service")["omniserve-rabbitmq"]["spec"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= labels.items()
    assert {p["port"] for p in service["ports"]} == {5672}


@pytest.fixture(scope="module")
def example_rabbitmq(rabbit_objs: list[dict[str, Any]]) -> Iterator[RabbitMQ]:
    """RabbitMQ with the example's settings file and the login its StatefulSet creates."""
    env = env_of(rabbit_objs, "StatefulSet", "omniserve-rabbitmq")
    conf = by_kind(rabbit_objs, "ConfigMap")["omniserve-rabbitmq"]["data"]["90-omniserve.conf"]
    with running(
        RabbitMQ(
            conf=conf,
            user=env["RABBITMQ_DEFAULT_USER"],
            password=env["RABBITMQ_DEFAULT_PASS"],
            vhost=env["RABBITMQ_DEFAULT_VHOST"],
        )
    ) as node:
        yield node


@pytest.mark.parametrize("app", APPS)
def test_each_part_logs_in_to_the_examples_rabbitmq(
    rabbit_objs: list[dict[str, Any]], example_rabbitmq: RabbitMQ, app: str
) -> None:
    url = env_of(rabbit_objs, "Deployment", app)["OMNISERVE_BROKER_URL"]
    assert unreachable(on_port(url, example_rabbitmq.port)) is None  # user, password, vhost


# -------------------------------------------------------------------------- Redis Cluster
@pytest.fixture(scope="module")
def cluster_objs() -> list[dict[str, Any]]:
    return kustomize(K8S / "examples" / "redis-cluster")


def node_names(objs: list[dict[str, Any]]) -> set[str]:
    sts = by_kind(objs, "StatefulSet")["omniserve-redis-cluster"]
    service = sts["spec"]["serviceName"]
    return {f"omniserve-redis-cluster-{i}.{service}" for i in range(sts["spec"]["replicas"])}


def test_the_data_plane_is_the_cluster_and_the_broker_the_single_redis(
    cluster_objs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = node_names(cluster_objs)
    assert len(nodes) == 6
    for app in APPS:
        s = settings_of(env_of(cluster_objs, "Deployment", app), monkeypatch)
        parts = urlsplit(s.redis_url)
        assert parts.scheme == "redis+cluster", app
        hosts = parts.netloc.rpartition("@")[2].split(",")
        assert {h.rsplit(":", 1)[0] for h in hosts} <= nodes, hosts
        assert (
            parts.netloc.rpartition("@")[0] == ":" + SECRETS["omniserve-secrets"]["redis-password"]
        )
        assert broker_target(s.broker).kind == "redis"  # Celery's broker cannot be the cluster
        assert urlsplit(s.broker).hostname == "omniserve-redis", app
    service = by_kind(cluster_objs, "Service")["omniserve-redis-cluster"]["spec"]
    assert service["clusterIP"] == "None" and service["publishNotReadyAddresses"] is True
    policy = by_kind(cluster_objs, "NetworkPolicy")["omniserve-redis-cluster"]
    init = "omniserve-redis-cluster-init"
    assert admitted(policy, 6379) == {*APPS, init, "omniserve-redis-cluster"}
    assert admitted(policy, 16379) == {"omniserve-redis-cluster"}
    job = by_kind(cluster_objs, "Job")[init]["spec"]["template"]["spec"]
    script = job["containers"][0]["command"][-1]
    assert "--cluster create" in script and "--cluster-replicas 1" in script
    assert "$(getent" in script  # Kubernetes turned $$( into the shell's $(
    assert "for i in 0 1 2 3 4 5" in script


def expand(value: str, env: dict[str, str]) -> str:
    """``$(NAME)`` in a container argument, as the kubelet expands it."""
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], value)


def test_the_nodes_form_a_cluster_that_sends_clients_to_their_names(
    cluster_objs: list[dict[str, Any]],
) -> None:
    """Six nodes from the StatefulSet's arguments (POD_NAME and the password as the kubelet
    expands them), made one cluster as the Job makes it: three primaries with a replica each,
    and the slots' endpoints are the nodes' DNS names, not their pod addresses."""
    server = str(redis7_server())
    sts = by_kind(cluster_objs, "StatefulSet")["omniserve-redis-cluster"]
    container = sts["spec"]["template"]["spec"]["containers"][0]
    password = SECRETS["omniserve-secrets"]["redis-password"]
    with ExitStack() as stack:
        ports = []
        for i in range(sts["spec"]["replicas"]):
            env = {"POD_NAME": f"omniserve-redis-cluster-{i}", "REDIS_PASSWORD": password}
            args = [expand(a, env) for a in container["args"]]
            ports.append(stack.enter_context(redis_from_args(args, binary=server)))
        client = create_cluster(ports, password)
        deadline = time.monotonic() + FORMED_WITHIN_S

        def endpoints() -> set[str]:  # each slot range's primary, then its replicas
            slots = client.execute_command("CLUSTER SLOTS")
            return {str(node[0]) for slot in slots for node in slot[2:]}

        while len(endpoints()) < 6:  # a replica is listed once its primary knows it
            assert time.monotonic() < deadline, endpoints()
            time.sleep(0.2)
        assert endpoints() == node_names(cluster_objs)


# ------------------------------------------------------------------------------ autoscaler
def test_the_autoscaler_reads_the_waiting_room_from_the_gateways_metric() -> None:
    """Not a Redis key, whose name and node a cluster would change: the waiting clients as
    every gateway exports them (deploy/dashboards/metric_names.txt)."""
    objs = kustomize(K8S / "keda")
    so = by_kind(objs, "ScaledObject")["omniserve-worker"]["spec"]
    assert {t["type"] for t in so["triggers"]} == {"prometheus"}
    queries = " ".join(t["metadata"]["query"] for t in so["triggers"])
    assert "omniserve_queue_waiting" in queries
    contract = (DEPLOY / "dashboards" / "metric_names.txt").read_text()
    line = next(li for li in contract.splitlines() if li.startswith("omniserve_queue_waiting "))
    assert line.split()[-1] == "gateway"
