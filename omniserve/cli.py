"""The ``omniserve`` command: up, gateway, worker, probe, recordings, doctor, drain, keys, usage,
bench."""

from __future__ import annotations

import argparse
import json
import socket
import sys
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from omniserve import drain
from omniserve.options import env_from_args

if TYPE_CHECKING:
    from omnicore.settings import Settings


def pocket_installed() -> bool:
    """Whether the pocket backend's packages and model files are installed."""
    from inference.registry import choose_backend

    return choose_backend("auto")[0] == "pocket"


def resolve_backend(name: str) -> str:
    """``auto`` means pocket when it is installed, else scripted."""
    from inference.registry import choose_backend

    return choose_backend(name)[0]


# --------------------------------------------------------------------------- gateway / worker


def data_plane_usable(what: str, s: Settings) -> bool:
    """Whether the Redis of ``s`` can carry this process (a Redis Cluster URL must find a cluster,
    and a broker of its own: ``streaming/cluster_check.py``); if not, one line says why."""
    from streaming.cluster_check import data_plane_problem

    problem = data_plane_problem(s.redis_url, s.broker_url)
    if problem:
        print(f"omniserve {what}: {problem}", file=sys.stderr, flush=True)
    return problem is None


def cmd_gateway(args: argparse.Namespace) -> int:
    """Run the FastAPI gateway under uvicorn."""
    env_from_args(args)
    import uvicorn

    from api.app import create_app
    from api.ops.access_log import quiet_uvicorn_request_lines
    from api.server.drain import GatewayServer
    from api.server.ws_protocol import ExplainedCloseProtocol
    from omnicore.logs import setup_logging
    from omnicore.settings import get_settings

    s = get_settings()
    if not data_plane_usable("gateway", s):
        return 1
    from omniserve.broker_check import refuse_unless_broker

    if not refuse_unless_broker(s, "omniserve gateway"):
        return 1
    if s.recordings:  # an unusable store URL is a settings error, told before serving
        from api.recordings.store import RecordingStore

        RecordingStore(s.recordings_url)
    setup_logging(s.log_level, s.secret_values(), s.log_format)
    quiet_uvicorn_request_lines()
    app = create_app(s)
    config = uvicorn.Config(
        app,
        host=s.gateway_host,
        port=s.gateway_port,
        log_level=s.log_level,
        # our logging (redacted lines) instead of uvicorn's handlers; the app writes its own
        # access line without the query string (api/ops/access_log.py)
        log_config=None,
        access_log=False,
        # the app decides whom to believe about X-Forwarded-For (OMNISERVE_TRUSTED_PROXIES);
        # uvicorn's own default would trust 127.0.0.1
        proxy_headers=False,
        ws=ExplainedCloseProtocol,  # an oversized message gets an error event before close 1009
        ws_max_size=s.max_frame_bytes,
        # a peer that stops answering is failed within interval + timeout
        # (api/gateway/client_watch.py)
        ws_ping_interval=s.ws_ping_interval_s,
        ws_ping_timeout=s.ws_ping_timeout_s,
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
    env_from_args(args)
    from omnicore.logs import setup_logging
    from omnicore.settings import get_settings

    s = get_settings()
    setup_logging(s.log_level, s.secret_values(), s.log_format)
    if not data_plane_usable("worker", s):
        return 1
    from inference.registry import choose_backend, preflight

    backend, note = choose_backend(s.backend)  # `auto`: each pool process resolves it again
    if note:
        print(f"omniserve worker: {note}", file=sys.stderr, flush=True)
    try:
        preflight(backend)
    except Exception as exc:  # noqa: BLE001 - refuse to start, naming what is missing
        print(f"omniserve worker: cannot start backend {backend!r}: {exc}", file=sys.stderr)
        return 2
    from omniserve.broker_check import refuse_unless_broker

    if not refuse_unless_broker(s, "omniserve worker"):
        return 1
    from celery.bin.celery import celery as celery_command

    import tasks.bootstrap  # noqa: F401 - imported for its side effect: the worker signals

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
    print(f"omniserve worker {node}: backend={backend} slots={slots}", flush=True)
    # Celery's own command line, run as `celery -A tasks.celery_app:app worker ...` would run it,
    # returns the worker's exit status (which `app.worker_main` drops): a worker that could not
    # start, or whose backend failed to load, exits non-zero
    status = celery_command.main(["-A", "tasks.celery_app:app", *argv], standalone_mode=False)
    return int(status or 0)


# --------------------------------------------------------------------------- probe / bench


def _cmd_up(args: argparse.Namespace) -> int:
    from omniserve.up import cmd_up

    return cmd_up(args)


def cmd_probe(args: argparse.Namespace) -> int:
    """A small command-line client."""
    import asyncio

    from omnicore.settings import get_settings
    from omniserve import probe
    from omniserve.options import client_url

    s = get_settings()  # as for every command: a setting that cannot be read is told, exit 2
    url = probe.ws_url(args.url or client_url(s.gateway_host, s.gateway_port))
    try:
        if args.what == "chat":
            return asyncio.run(
                probe.chat(url, " ".join(args.text), tts_out=args.out, api_key=args.api_key)
            )
        return asyncio.run(
            probe.audio(
                url,
                args.input,
                args.out,
                mode=args.mode,
                realtime=not args.fast,
                tail_s=args.tail,
                api_key=args.api_key,
            )
        )
    except (*probe.FAILURES, probe.GatewayRefused) as exc:
        print(f"omniserve probe: {probe.explain(url, exc)}", file=sys.stderr)
        return 1


def cmd_doctor(args: argparse.Namespace) -> int:
    """Load the backend here and check chat, speech and duplex (see omniserve/doctor.py)."""
    from omniserve import doctor

    return doctor.cli(args)


def xdist_args(rest: list[str]) -> list[str]:
    """pytest-xdist arguments for the suite: three worker processes, each taking whole files.

    Most of the suite's time is spent waiting on the processes a test starts (gateways, workers,
    models loading, timeouts running out): three workers keep two cores busy where two workers
    leave them idle a third of the time, so the suite ends sooner though each file runs a little
    slower.
    Whole files keep a module's shared stack in one process, handed out in the order the suite
    sorts them (longest first: ``tests/support/file_order.py``), not xdist's own. Nothing is added
    when the caller chose (``-n``, ``--dist``, ``-p no:xdist``) or pytest-xdist is not installed.
    """
    import importlib.util

    chosen = any(a.startswith(("-n", "--numprocesses", "--dist")) or a == "no:xdist" for a in rest)
    if chosen or importlib.util.find_spec("xdist") is None:
        return []
    return ["-n", "3", "--dist", "loadfile", "--no-loadscope-reorder"]


def cmd_test(args: argparse.Namespace) -> int:
    """Run the whole test suite (pytest); tests start their own Redis, gateways and workers."""
    import pytest

    argv = ["-q", "-rfEs", "-p", "no:cacheprovider", *xdist_args(args.rest), *args.rest]
    code = int(pytest.main(argv))
    return 0 if code == pytest.ExitCode.NO_TESTS_COLLECTED and args.rest else code


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmarks (see bench/)."""
    from bench.__main__ import main as bench_main

    return bench_main(args.rest)


def at_least_one(text: str) -> int:
    """An argparse type: a whole number of at least 1 (``up --workers 0`` waited for a worker
    until the model load timeout)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is less than 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="omniserve", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    up = sub.add_parser("up", help="start Redis (or use REDIS_URL), the gateway and workers")
    up.add_argument(
        "--backend",
        help="auto (default: pocket if installed, else scripted), scripted, pocket, "
        "... (also OMNISERVE_BACKEND)",
    )
    up.add_argument("--workers", type=at_least_one, default=1)
    up.add_argument("--redis-url", dest="redis_url")
    up.add_argument("--broker-url", dest="broker_url", help="also OMNISERVE_BROKER_URL")
    up.add_argument("--host")
    up.add_argument("--port", type=int)
    up.add_argument(
        "--flower",
        action="store_true",
        default=None,
        help="also start Flower (also OMNISERVE_FLOWER=1)",
    )
    up.add_argument("--flower-port", type=int, help="default 5555 (OMNISERVE_FLOWER_PORT)")
    up.add_argument(
        "--recordings",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="record every session (default: on; OMNISERVE_RECORDINGS, OMNISERVE_RECORDINGS_URL)",
    )
    up.set_defaults(func=_cmd_up)

    gw = sub.add_parser("gateway", help="run the gateway only")
    gw.add_argument("--host")
    gw.add_argument("--port", type=int)
    gw.add_argument("--redis-url", dest="redis_url")
    gw.add_argument("--broker-url", dest="broker_url", help="also OMNISERVE_BROKER_URL")
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
    wk.add_argument("--broker-url", dest="broker_url", help="also OMNISERVE_BROKER_URL")
    wk.set_defaults(func=cmd_worker)

    pr = sub.add_parser("probe", help="try the service from the command line")
    pr.add_argument(
        "--url",
        help="the gateway (http:// works too; default: OMNISERVE_GATEWAY_HOST and _PORT's,"
        " ws://127.0.0.1:8006)",
    )
    pr.add_argument("--api-key", dest="api_key", help="sent as Authorization: Bearer")
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

    from omniserve.recordings_cli import add_parser as add_recordings

    add_recordings(sub)

    dr = sub.add_parser("doctor", help="load a backend here and check chat, speech and duplex")
    dr.add_argument("--backend", help="minicpmo, llama_omni, pocket or scripted")
    dr.add_argument("--model", help="model directory (minicpmo)")
    dr.add_argument("--backend-url", dest="backend_url", help="llama-omni-server URL")
    dr.add_argument("--device")
    dr.add_argument("--backend-options", dest="backend_options", type=json.loads)
    dr.add_argument("--voice", help="reference voice WAV (default: the bundled speech sample)")
    dr.add_argument("--units", type=int, default=10, help="duplex units to run (default 10)")
    dr.add_argument("--json", action="store_true", help="print the report as JSON")
    dr.add_argument("--verbose", action="store_true", help="show the backend's logs")
    dr.set_defaults(func=cmd_doctor)

    drain.add_parser(sub)

    from omniserve.keys_cli import add_parser as add_keys

    add_keys(sub)

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
    from omnicore.settings import InvalidSettings  # pydantic: after --help, which needs none

    try:
        return int(args.func(args) or 0)
    except InvalidSettings as exc:
        print(f"omniserve: invalid settings\n{exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
