"""docker-compose.yml (and the pocket override): rendered by Docker Compose v2 itself
(``docker compose config``, no engine needed), then checked for the security and drain
properties; Redis and Flower are started from the rendered commands and probed; promtool checks
the Prometheus configuration as the container would see it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.deploy_tools import (
    DEPLOY,
    ROOT,
    SECRETS,
    compose_config,
    compose_model,
    promtool,
    run,
)
from tests.support.redis_flower_checks import (
    assert_flower_requires_login,
    assert_redis_hardened,
    flower_from_command,
    on_port,
    redis_from_args,
)

FILES = [("docker-compose.yml",), ("docker-compose.yml", "deploy/compose.pocket.yml")]
OMNISERVE = ("gateway", "worker", "flower")


@pytest.fixture(scope="module", params=FILES, ids=["gpu", "pocket"])
def model(request: pytest.FixtureRequest) -> dict[str, Any]:
    return compose_model(*request.param, profiles=("monitoring",))


def services(model: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return model["services"]


def duration_s(value: str | int) -> float:
    """Compose durations ("630s", "1m30s") in seconds."""
    if isinstance(value, int):
        return value / 1e9  # compose config reports nanoseconds for some versions
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3}
    return sum(float(n) * units[u] for n, u in re.findall(r"([\d.]+)(ms|h|m|s)", value))


@pytest.mark.parametrize("missing", sorted(SECRETS))
def test_compose_refuses_to_start_without_each_secret(missing: str) -> None:
    env = {k: v for k, v in SECRETS.items() if k != missing}
    out = compose_config("docker-compose.yml", env=env)
    assert out.returncode != 0
    assert missing in out.stderr


def test_nothing_is_published_beyond_loopback(model: dict[str, Any]) -> None:
    published = {}
    for name, svc in services(model).items():
        for port in svc.get("ports", []):
            assert port.get("host_ip") == "127.0.0.1", (name, port)
            published[name] = int(port["target"])
    assert published == {"gateway": 8006, "flower": 5555, "prometheus": 9090}
    assert "ports" not in services(model)["redis"]
    assert services(model)["worker"]["expose"] == ["9108"]


def test_redis_runs_with_password_and_memory_cap(model: dict[str, Any]) -> None:
    svc = services(model)["redis"]
    limit = int(svc["deploy"]["resources"]["limits"]["memory"])
    assert svc["environment"]["REDISCLI_AUTH"] == SECRETS["OMNISERVE_REDIS_PASSWORD"]
    assert svc["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    with redis_from_args(svc["command"]) as port:
        assert_redis_hardened(port, SECRETS["OMNISERVE_REDIS_PASSWORD"], limit)
        for name in OMNISERVE:
            url = services(model)[name]["environment"]["OMNISERVE_REDIS_URL"]
            assert url.split("@", 1)[1].startswith("redis:6379/"), url
            assert redis.Redis.from_url(on_port(url, port), socket_timeout=5).ping(), name


def test_flower_asks_for_its_login(model: dict[str, Any]) -> None:
    svc = services(model)["flower"]
    env = dict(svc["environment"])
    assert env["FLOWER_BASIC_AUTH"] == SECRETS["OMNISERVE_FLOWER_BASIC_AUTH"]
    with redis_from_args(
        ["redis-server", "--requirepass", SECRETS["OMNISERVE_REDIS_PASSWORD"]]
    ) as p:
        env["OMNISERVE_REDIS_URL"] = on_port(env["OMNISERVE_REDIS_URL"], p)
        with flower_from_command(svc["command"], env) as url:
            assert_flower_requires_login(url, SECRETS["OMNISERVE_FLOWER_BASIC_AUTH"])


def test_every_service_has_a_health_check(model: dict[str, Any]) -> None:
    for name in ("redis", "gateway", "worker", "flower"):
        test = services(model)[name]["healthcheck"]["test"]
        assert test[0] == "CMD" and len(test) > 1, name
    deps = services(model)["gateway"]["depends_on"]
    assert deps["redis"]["condition"] == "service_healthy"


def test_gateway_gets_the_security_settings(model: dict[str, Any]) -> None:
    env = services(model)["gateway"]["environment"]
    assert env["OMNISERVE_API_KEYS"] == SECRETS["OMNISERVE_API_KEYS"]
    assert env["OMNISERVE_ADMIN_TOKEN"] == SECRETS["OMNISERVE_ADMIN_TOKEN"]
    for name in ("worker", "flower", "redis"):
        other = services(model)[name].get("environment", {})
        assert "OMNISERVE_API_KEYS" not in other and "OMNISERVE_ADMIN_TOKEN" not in other, name


@pytest.mark.parametrize("name", OMNISERVE)
def test_environment_parses_as_omniserve_settings(
    model: dict[str, Any], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from omnicore.settings import Settings

    for key in list(os.environ):
        if key.startswith("OMNISERVE_") or key == "REDIS_URL":
            monkeypatch.delenv(key)
    env = services(model)[name]["environment"]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert Settings().redis_url == env["OMNISERVE_REDIS_URL"]


def test_stop_grace_covers_the_drain(model: dict[str, Any]) -> None:
    for name in ("gateway", "worker"):
        svc = services(model)[name]
        drain = float(svc["environment"]["OMNISERVE_DRAIN_GRACE_S"])
        assert duration_s(svc["stop_grace_period"]) >= drain + 30, name
        assert svc["init"] is True  # signals reach the process, children are reaped


def test_voices_read_only_and_recordings_on_a_volume(model: dict[str, Any]) -> None:
    for name in ("gateway", "worker"):
        svc = services(model)[name]
        target = svc["environment"]["OMNISERVE_VOICES_DIR"]
        (voices,) = [v for v in svc["volumes"] if v["target"] == target]
        assert voices["read_only"] is True, name
    gw = services(model)["gateway"]
    rec = gw["environment"]["OMNISERVE_RECORDINGS_URL"]
    (vol,) = [v for v in gw["volumes"] if v["target"] == rec]
    assert vol["type"] == "volume" and not vol.get("read_only")


def test_pocket_override_keeps_voices_and_drops_the_gpu() -> None:
    model = compose_model("docker-compose.yml", "deploy/compose.pocket.yml")
    worker = services(model)["worker"]
    assert worker["environment"]["OMNISERVE_BACKEND"] == "pocket"
    assert [v["target"] for v in worker["volumes"]] == ["/voices"]
    assert "deploy" not in worker or not worker["deploy"].get("resources")


def test_prometheus_config_is_valid_as_the_container_sees_it(
    model: dict[str, Any], tmp_path: Path
) -> None:
    """promtool checks the scrape config with every mounted file at its container path."""
    svc = services(model)["prometheus"]
    mapping = {v["target"]: Path(v["source"]) for v in svc["volumes"]}
    token = tmp_path / "admin_token"
    token.write_text(SECRETS["OMNISERVE_ADMIN_TOKEN"])
    mapping[f"/run/secrets/{svc['secrets'][0]['source']}"] = token
    config_path = next(p for t, p in mapping.items() if t.endswith("prometheus.yml"))
    text = config_path.read_text()
    for target, source in mapping.items():
        text = text.replace(target, str(source))
    assert "/etc/prometheus" not in text and "/run/secrets" not in text, "unmounted path"
    local = tmp_path / "prometheus.yml"
    local.write_text(text)
    out = run([str(promtool()), "check", "config", str(local)])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr
    # it scrapes every service that serves /metrics, gateways with the admin token
    assert "names: [gateway]" in text and "names: [worker]" in text
    assert (DEPLOY / "prometheus" / "omniserve-alerts.yml").exists()
    assert ROOT.joinpath(".gitignore").read_text().count("/.env") == 1
