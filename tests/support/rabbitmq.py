"""A real RabbitMQ node for the tests: Debian's ``rabbitmq-server``, started on free loopback
ports with its own node name, data directory, Erlang cookie and epmd, so that parallel test
processes (and a system RabbitMQ) never meet.

CI starts on a clean machine: when the server is missing it is installed with ``apt-get``
(under the run-wide apt lock, ``tests/support/apt.py``); where that is impossible the test is
skipped, saying why.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from omniserve.children import dies_with_parent
from omniserve.redis_server import free_port
from tests.support.apt import apt_lock

# the server itself, not /usr/sbin's wrapper, which changes to the `rabbitmq` user and its
# fixed data directory
SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
START_TIMEOUT_S = 90.0  # Erlang's boot on two busy cores


def rabbitmq_server() -> Path:
    """The server's start script, installed with apt-get first if missing (skip if that
    cannot be done here)."""
    if SERVER.exists():
        return SERVER
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        with apt_lock():
            if not SERVER.exists():
                subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True)
                subprocess.run(
                    [
                        "apt-get",
                        "install",
                        "-y",
                        "-qq",
                        "--no-install-recommends",
                        "rabbitmq-server",
                    ],
                    env=env,
                    capture_output=True,
                    timeout=1800,
                )
    if not SERVER.exists():
        pytest.skip("rabbitmq-server is not installed and apt-get could not install it (root)")
    return SERVER


class RabbitMQ:
    """One RabbitMQ node on loopback: ``url`` is its AMQP URL."""

    def __init__(
        self,
        conf: str = "",
        advanced: str = "[].",
        user: str = "omni",
        password: str = "omni-test-pw",
        vhost: str = "/",
    ) -> None:
        """``conf``: more rabbitmq.conf lines (a deployment's own file, say); ``advanced``: its
        advanced.config (Erlang terms); ``user``, ``password``, ``vhost``: the login it is
        created with."""
        self.conf = conf
        self.advanced = advanced
        self.user, self.password, self.vhost = user, password, vhost
        self.workdir = Path(tempfile.mkdtemp(prefix="omniserve-rabbitmq-"))
        self.port = free_port()
        self.dist_port = free_port()
        self.epmd_port = free_port()
        self.node = f"omnitest{self.port}@localhost"
        self.proc: subprocess.Popen[bytes] | None = None
        self.epmd: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://{self.user}:{self.password}@127.0.0.1:{self.port}/{self.vhost}"

    @property
    def log(self) -> Path:
        return self.workdir / "server.log"

    def _env(self) -> dict[str, str]:
        home = self.workdir / "home"
        home.mkdir(exist_ok=True)
        return {
            **os.environ,
            "HOME": str(home),  # its own .erlang.cookie
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_MNESIA_BASE": str(self.workdir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.workdir / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.workdir / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.workdir / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.workdir / "enabled_plugins"),
            "RABBITMQ_ENABLED_PLUGINS": "",
            "RABBITMQ_PID_FILE": str(self.workdir / "server.pid"),
            "RABBITMQ_CONF_ENV_FILE": str(self.workdir / "rabbitmq-env.conf"),
        }

    def start(self) -> None:
        server = rabbitmq_server()
        (self.workdir / "enabled_plugins").write_text("[].\n")
        (self.workdir / "rabbitmq-env.conf").write_text("")
        (self.workdir / "advanced.config").write_text(self.advanced + "\n")
        (self.workdir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            f"default_user = {self.user}\n"
            f"default_pass = {self.password}\n"
            f"default_vhost = {self.vhost}\n"
            "loopback_users = none\n"
            "log.console = true\nlog.file = false\n" + self.conf
        )
        # epmd in the foreground, as a child of ours: one the server started itself would detach
        # (``-daemon``) and outlive the test
        epmd = Path(shutil.which("epmd") or "/usr/bin/epmd")
        with open(self.workdir / "epmd.log", "wb") as out:
            self.epmd = subprocess.Popen(
                [str(epmd), "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=dies_with_parent(signal.SIGKILL),
            )
        with open(self.log, "wb") as out:  # the child keeps its own copy
            self.proc = subprocess.Popen(
                [str(server)],
                env=self._env(),
                cwd=self.workdir,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=dies_with_parent(signal.SIGKILL),
            )
        self.wait_ready()

    def wait_ready(self) -> None:
        """Until an AMQP login goes through (the port opens before the node takes logins)."""
        from kombu import Connection

        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, self.tail()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    pass
                with Connection(self.url, connect_timeout=2) as conn:
                    conn.connect()
                return
            except Exception:  # not up yet
                time.sleep(0.3)
        raise RuntimeError(f"rabbitmq-server did not start:\n{self.tail()}")

    def freeze(self, frozen: bool) -> None:
        """Stop (SIGSTOP) or resume (SIGCONT) the whole node: it keeps its sockets, and answers
        nothing meanwhile."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGSTOP if frozen else signal.SIGCONT)

    def ctl(self, *args: str) -> str:
        """``rabbitmqctl ARGS`` against this node (its cookie, epmd and name), its output."""
        ctl = SERVER.with_name("rabbitmqctl")
        done = subprocess.run(
            [str(ctl), "-n", self.node, *args],
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop the node (its whole process group: beam, inet_gethost), its epmd, its files."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
            except ProcessLookupError:
                pass
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # helpers left in the group
            except ProcessLookupError:
                pass
        if self.epmd is not None and self.epmd.poll() is None:
            self.epmd.kill()
            self.epmd.wait(timeout=5)
        shutil.rmtree(self.workdir, ignore_errors=True)
