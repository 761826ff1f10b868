"""``omniserve keys create|ls|rotate|revoke|quota`` and ``omniserve usage``: named API keys and
their usage, straight through Redis (``streaming/keystore.py``, ``streaming/usage.py``), so
they work from any machine that reaches it and take effect on every gateway without a restart.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import orjson


def add_parser(sub: Any) -> None:
    """The ``keys`` and ``usage`` subcommands on the ``omniserve`` parser."""
    ke = sub.add_parser("keys", help="named API keys: create, ls, rotate, revoke, quota")
    ke.add_argument("--redis-url", dest="redis_url")
    ksub = ke.add_subparsers(dest="action", required=True)
    kc = ksub.add_parser("create", help="a new key (its secret is printed once)")
    kc.add_argument("name")
    _quota_options(kc)
    kl = ksub.add_parser("ls", help="every key, revoked ones too (never the secrets)")
    kr = ksub.add_parser("rotate", help="a new secret for a key; the old one is refused")
    kr.add_argument("name")
    kv = ksub.add_parser("revoke", help="refuse a key from now on, on every gateway")
    kv.add_argument("name")
    kq = ksub.add_parser("quota", help="set a key's quota (an option left out: no limit)")
    kq.add_argument("name")
    _quota_options(kq)
    for p in (kc, kl, kr, kv, kq):
        p.add_argument("--json", action="store_true", help="print JSON")
    ke.set_defaults(func=cmd_keys)

    us = sub.add_parser("usage", help="usage per key, per hour or day")
    us.add_argument("--redis-url", dest="redis_url")
    us.add_argument("--key", action="append", help="a key name (repeatable; default: all)")
    us.add_argument("--day", action="store_true", help="by the day (default: by the hour)")
    us.add_argument("--since", type=float, help="hours (days with --day) back; default 24 (30)")
    us.add_argument("--json", action="store_true", help="print JSON")
    us.set_defaults(func=cmd_usage)


def _quota_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-sessions", type=int, help="open sessions at once, all gateways")
    p.add_argument("--minutes-per-day", type=float, help="session-minutes per UTC day")
    p.add_argument("--max-session-s", type=float, help="the longest one session may run")


def _run(args: argparse.Namespace, body: Callable[[Any, Any], Awaitable[int]]) -> int:
    """Run ``body(settings, redis)`` against the configured Redis; one line on a Redis error."""
    import redis

    from omnicore.redact import redact_url
    from omnicore.settings import get_settings
    from omniserve.options import env_from_args
    from streaming.redis_url import async_client

    env_from_args(args)
    s = get_settings()

    async def main() -> int:
        client = async_client(s.redis_url)
        try:
            return await body(s, client)
        finally:
            await client.aclose()

    try:
        return asyncio.run(main())
    except redis.RedisError as exc:
        print(
            f"omniserve: cannot reach Redis at {redact_url(s.redis_url)} ({exc})", file=sys.stderr
        )
        return 1


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def cmd_keys(args: argparse.Namespace) -> int:
    from streaming.keys import Keys
    from streaming.keystore import KeyProblem, KeyQuota, KeyStore

    async def body(s: Any, client: Any) -> int:
        store = KeyStore(client, Keys(s.key_prefix))
        quota = KeyQuota(
            getattr(args, "max_sessions", None),
            getattr(args, "minutes_per_day", None),
            getattr(args, "max_session_s", None),
        )
        try:
            if args.action == "ls":
                records = [r.public() for r in await store.records()]
                if args.json:
                    print(orjson.dumps({"keys": records}).decode())
                    return 0
                print(f"{'name':24} {'state':8} {'created':21} quota")
                for r in records:
                    q = {k: v for k, v in dict(r["quota"]).items() if v is not None}  # type: ignore[call-overload]
                    created = _when(r["created_at"])  # type: ignore[arg-type]
                    print(f"{r['name']:24} {r['state']:8} {created:21} {q or '-'}")
                return 0
            if args.action in ("create", "rotate"):
                if args.action == "create":
                    secret, rec = await store.create(args.name, quota)
                else:
                    secret, rec = await store.rotate(args.name)
                if args.json:
                    print(orjson.dumps({**rec.public(), "key": secret}).decode())
                else:
                    print(f"{rec.name}: {secret}")
                    print("(shown once: only its hash is stored)", file=sys.stderr)
                return 0
            rec = (
                await store.revoke(args.name)
                if args.action == "revoke"
                else await store.set_quota(args.name, quota)
            )
            done = f"{rec.name}: {'revoked' if args.action == 'revoke' else 'quota set'}"
            print(orjson.dumps(rec.public()).decode() if args.json else done)
            return 0
        except KeyProblem as exc:
            print(f"omniserve keys: {exc}", file=sys.stderr)
            return 1

    return _run(args, body)


def cmd_usage(args: argparse.Namespace) -> int:
    from streaming.keys import Keys
    from streaming.usage import DAY_S, HOUR_S, UsageLedger, usage_report

    async def body(s: Any, client: Any) -> int:
        ledger = UsageLedger(client, Keys(s.key_prefix))
        size = DAY_S if args.day else HOUR_S
        back = args.since if args.since is not None else (30 if args.day else 24)
        now = time.time()
        report = await usage_report(
            ledger, args.key, "day" if args.day else "hour", now - back * size, now
        )
        if args.json:
            print(orjson.dumps(report).decode())
            return 0
        keys: dict[str, Any] = report["keys"]  # type: ignore[assignment]
        cols = (
            "sessions",
            "responses",
            "session_s",
            "audio_in_s",
            "audio_out_s",
            "text_tokens_in",
            "text_tokens_out",
            "frames_in",
            "worker_s",
            "queue_wait_s",
        )
        print(f"{'key':20} {'from':21} " + " ".join(f"{c:>15}" for c in cols))
        for name, data in keys.items():
            for row in [*data["buckets"], {"start": None, **data["total"]}]:
                when = _when(row["start"]) if row["start"] is not None else "total"
                print(f"{name:20} {when:21} " + " ".join(f"{row[c]:>15}" for c in cols))
        return 0

    return _run(args, body)
