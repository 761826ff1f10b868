"""The compose overrides for a broker of its own and a sharded data plane:
deploy/compose.rabbitmq.yml (RabbitMQ as Celery's broker) and deploy/compose.cluster.yml (the
shared state on a Redis Cluster of 3 primaries and 3 replicas), alone and together, rendered by
Docker Compose itself; RabbitMQ is started with deploy/rabbitmq/rabbitmq.conf and the compose
login, and the cluster nodes from their rendered command, made one cluster for real.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from streaming.broker_url import broker_target, unreachable
from tests.support.cluster_create import FORMED_WITHIN_S, create_cluster
from tests.support.deploy_tools import DEPLOY, SECRETS, compose_config
from tests.support.deployed_settings import settings_of
from tests.support.rabbitmq import RabbitMQ
from tests.support.redis_flower_checks import on_port, redis_from_args
from tests.support.services import running

RABBITMQ_SECRET = {"OMNISERVE_RABBITMQ_PASSWORD": "rabbitpw0123456789abcdef"}
RABBITMQ = ("docker-compose.yml", "deploy/compose.rabbitmq.yml")
CLUSTER = ("docker-compose.yml", "deploy/compose.cluster.yml")
BOTH = ("docker-compose.yml", "deploy/compose.cluster.yml", "deploy/compose.rabbitmq.yml")
OMNISERVE = ("gateway", "worker", "flower")
NODES = [f"redis-node-{i}" for i in range(1, 7)]


def render(*files: str) -> dict[str, Any]:
    out = compose_config(*files, env={**SECRETS, **RABBITMQ_SECRET})
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout)["services"])


# ------------------------------------------------------------------------------- RabbitMQ
def test_rabbitmq_needs_its_password() -> None:
    out = compose_config(*RABBITMQ, env=SECRETS)
    assert out.returncode != 0 and "OMNISERVE_RABBITMQ_PASSWORD" in out.stderr


@pytest.mark.parametrize("files", [RABBITMQ, BOTH], ids=["redis", "cluster"])
def test_every_part_takes_rabbitmq_as_its_broker(
    files: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    services = render(*files)
    rabbit = services["rabbitmq"]
    assert "ports" not in rabbit  # on the compose network only
    assert rabbit["healthcheck"]["test"][0] == "CMD"
    for name in OMNISERVE:
        svc = services[name]
        assert svc["depends_on"]["rabbitmq"]["condition"] == "service_healthy", name
        s = settings_of(svc["environment"], monkeypatch)
        assert s.separate_broker and broker_target(s.broker).kind == "amqp", name
        assert urlsplit(s.broker).hostname == "rabbitmq"
        assert RABBITMQ_SECRET["OMNISERVE_RABBITMQ_PASSWORD"] in s.secret_values()  # never logged


@pytest.fixture(scope="module")
def compose_rabbitmq() -> Iterator[RabbitMQ]:
    """RabbitMQ with the deployment's own settings file and the login compose gives it."""
    env = render(*RABBITMQ)["rabbitmq"]["environment"]
    with running(
        RabbitMQ(
            conf=(DEPLOY / "rabbitmq" / "rabbitmq.conf").read_text(),
            user=env["RABBITMQ_DEFAULT_USER"],
            password=env["RABBITMQ_DEFAULT_PASS"],
            vhost=env["RABBITMQ_DEFAULT_VHOST"],
        )
    ) as node:
        yield node


def test_the_compose_broker_url_logs_in_and_the_ack_deadline_suits_long_sessions(
    compose_rabbitmq: RabbitMQ,
) -> None:
    url = render(*RABBITMQ)["gateway"]["environment"]["OMNISERVE_BROKER_URL"]
    local = on_port(url, compose_rabbitmq.port)  # user, password and virtual host as given
    assert unreachable(local) is None
    said = compose_rabbitmq.ctl("eval", "application:get_env(rabbit, consumer_timeout).")
    timeout_ms = int(re.search(r"\{ok,\s*(\d+)\}", said).group(1))  # type: ignore[union-attr]
    assert timeout_ms >= 3600 * 1000  # past RabbitMQ's 30 min: never under a session's length


# -------------------------------------------------------------------------- Redis Cluster
def test_the_data_plane_is_the_cluster_and_the_broker_the_single_redis(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    services = render(*CLUSTER)
    init = services["redis-cluster-init"]
    assert set(init["depends_on"]) == set(NODES)
    assert all(init["depends_on"][n]["condition"] == "service_healthy" for n in NODES)
    for name in OMNISERVE:
        svc = services[name]
        cond = svc["depends_on"]["redis-cluster-init"]["condition"]
        assert cond == "service_completed_successfully", name
        s = settings_of(svc["environment"], monkeypatch)
        assert s.redis_url.startswith("redis+cluster://"), name
        hosts = urlsplit(s.redis_url).netloc.rpartition("@")[2].split(",")
        assert {h.split(":")[0] for h in hosts} <= set(NODES)
        with pytest.raises(ValueError, match="Redis Cluster"):
            broker_target(s.redis_url)  # why the broker is named: Celery cannot use a cluster
        assert broker_target(s.broker).kind == "redis"
        assert urlsplit(s.broker).hostname == "redis"
    for node in NODES:
        assert "ports" not in services[node]


def test_the_cluster_nodes_form_a_cluster_of_three_primaries_and_three_replicas() -> None:
    """Each node from its rendered command (on loopback, a port of its own), then the cluster
    made as the init job makes it (redis-cli --cluster create, one replica each)."""
    services = render(*CLUSTER)
    password = SECRETS["OMNISERVE_REDIS_PASSWORD"]
    init_script = services["redis-cluster-init"]["command"][-1]
    assert "--cluster create" in init_script and "--cluster-replicas 1" in init_script
    with ExitStack() as stack:
        ports = [stack.enter_context(redis_from_args(services[n]["command"])) for n in NODES]
        create_cluster(ports, password)
        deadline = time.monotonic() + FORMED_WITHIN_S
        # a replica's link authenticates (masterauth): every replica is in sync
        for p in ports:
            info = redis.Redis(port=p, password=password).info("replication")
            if info["role"] == "slave":
                while info["master_link_status"] != "up":
                    assert time.monotonic() < deadline, info
                    time.sleep(0.2)
                    info = redis.Redis(port=p, password=password).info("replication")
