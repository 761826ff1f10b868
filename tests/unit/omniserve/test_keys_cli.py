"""omniserve/keys_cli.py: ``omniserve keys`` and ``omniserve usage`` against the run's Redis."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import orjson
import pytest
import redis as redis_sync

from streaming.keys import Keys
from streaming.keystore import digest
from tests.support.stack import ROOT


def omniserve(redis_url: str, keys: Keys, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNISERVE_")}
    env.update(OMNISERVE_REDIS_URL=redis_url, OMNISERVE_KEY_PREFIX=keys.prefix)
    return subprocess.run(
        [sys.executable, "-m", "omniserve", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_keys_from_create_to_revoke(
    redis_server: str, keys: Keys, sync_redis: redis_sync.Redis
) -> None:
    made = omniserve(redis_server, keys, "keys", "create", "acme", "--max-sessions", "2")
    assert made.returncode == 0, made.stderr
    name, secret = made.stdout.strip().split(": ")
    assert name == "acme" and secret.startswith("osk_") and "shown once" in made.stderr
    assert sync_redis.hexists(keys.api_keys, digest(secret))
    again = omniserve(redis_server, keys, "keys", "create", "acme")
    assert again.returncode == 1 and "already names an active key" in again.stderr
    bad = omniserve(redis_server, keys, "keys", "create", "No Good")
    assert bad.returncode == 1 and "a key name is" in bad.stderr
    rotated = omniserve(redis_server, keys, "keys", "rotate", "acme", "--json")
    new = orjson.loads(rotated.stdout)["key"]
    assert new != secret and not sync_redis.hexists(keys.api_keys, digest(secret))
    quota = omniserve(redis_server, keys, "keys", "quota", "acme", "--minutes-per-day", "30")
    assert quota.stdout.strip() == "acme: quota set"
    listing = omniserve(redis_server, keys, "keys", "ls")
    assert "acme" in listing.stdout and "'minutes_per_day': 30.0" in listing.stdout
    assert "max_sessions" not in listing.stdout  # the quota set replaces the whole quota
    assert new not in listing.stdout
    assert omniserve(redis_server, keys, "keys", "revoke", "acme").stdout.strip() == (
        "acme: revoked"
    )
    gone = omniserve(redis_server, keys, "keys", "revoke", "acme")
    assert gone.returncode == 1 and "no active key named 'acme'" in gone.stderr


def test_usage_reads_the_aggregates(
    redis_server: str, keys: Keys, sync_redis: redis_sync.Redis
) -> None:
    now = time.time()
    sync_redis.hset(keys.usage_hour("acme", int(now // 3600)), mapping={"audio_in_s": 2.5})
    sync_redis.hset(keys.usage_day("acme", int(now // 86400)), mapping={"audio_in_s": 2.5})
    sync_redis.sadd(keys.usage_names, "acme")
    hourly = orjson.loads(omniserve(redis_server, keys, "usage", "--json").stdout)
    assert hourly["granularity"] == "hour"
    assert hourly["keys"]["acme"]["total"]["audio_in_s"] == 2.5
    daily = omniserve(redis_server, keys, "usage", "--day", "--key", "acme")
    assert daily.returncode == 0 and "total" in daily.stdout and "2.5" in daily.stdout


@pytest.mark.parametrize("args", [("keys", "ls"), ("usage",)])
def test_redis_away_is_one_line(keys: Keys, args: tuple[str, ...]) -> None:
    done = omniserve("redis://127.0.0.1:1/0", keys, *args)
    assert done.returncode == 1 and "cannot reach Redis" in done.stderr
    assert "Traceback" not in done.stderr
