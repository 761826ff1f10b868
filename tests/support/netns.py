"""Separate hosts on one machine: network namespaces, each with its own address on a private
IPv4 network, so a test's Redis, gateways and workers reach each other the way hosts do (no
127.0.0.1 between them), and a link between two of them can be cut for real.

A ``Network`` is a bridge in the root namespace holding ``10.201.N.1/24`` (the test process
itself is a host on it, ``network.root``) and one namespace per ``Host`` joined to the bridge by
a veth pair, with ``10.201.N.2``, ``.3``, ... and a default route through the bridge. ``N`` is
picked under a file lock among the subnets no interface of this machine holds, and every name
carries a random tag, so parallel test processes never clash. ``close`` (or leaving the
``network`` context) kills what runs in its namespaces and removes them, their links and the
bridge; what a killed test process leaves behind is removed by the next one.

A cut between two hosts is a blackhole route to each other's address in both namespaces:
packets between them are dropped silently (connections stay open and hear nothing, as across a
real partition), while each still reaches every other host. ``restore`` removes the routes. A
host may also be ``unplug``-ged from the network as a whole (its link down).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.supervisor import process_alive
from tests.support.apt import apt_lock

PREFIX = "omni"  # namespace names: omni-<pid>-<tag>-<host>
SUBNET = "10.201"  # networks are 10.201.N.0/24
LOCK = Path("/tmp/omniserve-netns.lock")


class NetnsUnavailable(RuntimeError):
    """This machine does not let the test make network namespaces (no ``ip``, not root)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


@dataclass
class Host:
    """One namespace on a ``Network`` (``ns`` None: the root namespace, the test's own)."""

    name: str
    ns: str | None
    address: str
    link: str  # its veth's name on the bridge side (root namespace)

    def argv(self, command: Sequence[str]) -> list[str]:
        """``command`` run inside this host (``ip netns exec`` execs it: same process id)."""
        return ["ip", "netns", "exec", self.ns, *command] if self.ns else list(command)

    def popen(self, command: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``command`` inside this host."""
        return subprocess.Popen(self.argv(command), **kwargs)

    def run(self, command: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(command), capture_output=True, text=True, check=check, timeout=30
        )


@dataclass
class Network:
    """A private network of hosts; see the module docstring."""

    subnet: int
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    hosts: list[Host] = field(default_factory=list)
    cuts: set[tuple[str, str]] = field(default_factory=set)

    @property
    def bridge(self) -> str:
        return f"osb{self.tag}"

    @property
    def root(self) -> Host:
        """The root namespace as a host on this network (the test process's address here)."""
        return Host("root", None, f"{SUBNET}.{self.subnet}.1", self.bridge)

    @classmethod
    def create(cls) -> Network:
        """A new network with its bridge up (no hosts yet)."""
        _clean_stale()
        with _locked():
            net = cls(_free_subnet())
            _ip("link", "add", net.bridge, "type", "bridge")
            _ip("link", "set", "dev", net.bridge, "alias", f"{PREFIX}-{os.getpid()}")
            _ip("addr", "add", f"{net.root.address}/24", "dev", net.bridge)
            _ip("link", "set", "dev", net.bridge, "up")
        return net

    def host(self, name: str) -> Host:
        """A new namespace on this network, with its own address."""
        i = len(self.hosts) + 2
        ns = f"{PREFIX}-{os.getpid()}-{self.tag}-{name}"
        link = f"os{self.tag}{i}"
        _ip("netns", "add", ns)
        h = Host(name, ns, f"{SUBNET}.{self.subnet}.{i}", link)
        self.hosts.append(h)
        _ip("link", "add", link, "type", "veth", "peer", "name", f"{link}p")
        _ip("link", "set", f"{link}p", "netns", ns)
        _ip("link", "set", link, "master", self.bridge)
        _ip("link", "set", link, "up")
        for cmd in (
            ["ip", "link", "set", "lo", "up"],
            ["ip", "link", "set", f"{link}p", "name", "eth0"],
            ["ip", "addr", "add", f"{h.address}/24", "dev", "eth0"],
            ["ip", "link", "set", "eth0", "up"],
            ["ip", "route", "add", "default", "via", self.root.address],
        ):
            h.run(cmd)
        return h

    def cut(self, a: Host, b: Host) -> None:
        """Drop every packet between ``a`` and ``b`` (both ways), silently."""
        for here, there in ((a, b), (b, a)):
            here.run(["ip", "route", "replace", "blackhole", f"{there.address}/32"])
        self.cuts.add((a.name, b.name))

    def restore(self, a: Host, b: Host) -> None:
        """Let ``a`` and ``b`` reach each other again."""
        for here, there in ((a, b), (b, a)):
            here.run(["ip", "route", "del", "blackhole", f"{there.address}/32"], check=False)
        self.cuts.discard((a.name, b.name))

    @contextlib.contextmanager
    def apart(self, a: Host, b: Host) -> Iterator[None]:
        """``a`` and ``b`` cut off from each other for the ``with`` block."""
        self.cut(a, b)
        try:
            yield
        finally:
            self.restore(a, b)

    def unplug(self, h: Host) -> None:
        """Cut ``h`` off from every host (its link down)."""
        _ip("link", "set", "dev", h.link, "down")

    def plug(self, h: Host) -> None:
        _ip("link", "set", "dev", h.link, "up")

    def close(self) -> None:
        """Kill what runs in the hosts, remove them, their links and the bridge."""
        for h in self.hosts:
            if h.ns:
                _remove_namespace(h.ns)
        _ip("link", "del", self.bridge, check=False)
        self.hosts.clear()


def check_available() -> None:
    """Raise ``NetnsUnavailable`` (saying why) unless namespaces and veth links can be made
    (``ip``, from Debian's ``iproute2``, is installed first where apt can and it is missing)."""
    if shutil.which("ip") is None and shutil.which("apt-get") is not None and os.geteuid() == 0:
        with apt_lock():
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True, timeout=600)
            subprocess.run(
                ["apt-get", "install", "-y", "-qq", "iproute2"], capture_output=True, timeout=600
            )
    probe = f"{PREFIX}-{os.getpid()}-probe{secrets.token_hex(2)}"
    try:
        made = _ip("netns", "add", probe, check=False)
    except FileNotFoundError as exc:
        raise NetnsUnavailable("no `ip` command (iproute2)") from exc
    if made.returncode != 0:
        raise NetnsUnavailable(f"`ip netns add` is not permitted here: {made.stderr.strip()}")
    try:
        link = f"osp{secrets.token_hex(3)}"
        veth = _ip("link", "add", link, "type", "veth", "peer", "name", f"{link}p", check=False)
        if veth.returncode != 0:
            raise NetnsUnavailable(f"veth links cannot be made here: {veth.stderr.strip()}")
        _ip("link", "del", link, check=False)
    finally:
        _ip("netns", "del", probe, check=False)


@contextlib.contextmanager
def network() -> Iterator[Network]:
    """A new ``Network`` for the ``with`` block, removed at its end."""
    net = Network.create()
    try:
        yield net
    finally:
        net.close()


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    with LOCK.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _free_subnet() -> int:
    """The lowest ``N`` such that no interface holds an address in 10.201.N.0/24."""
    used = set()
    for word in _ip("-o", "-4", "addr", "show").stdout.split():
        if word.startswith(f"{SUBNET}."):
            used.add(int(word.split(".")[2]))
    for n in range(1, 255):
        if n not in used:
            return n
    raise NetnsUnavailable(f"every {SUBNET}.N.0/24 network is taken")


def _remove_namespace(ns: str) -> None:
    """Kill every process inside ``ns`` (all of them started there by the test), then remove it
    (its veth goes with it)."""
    pids = _ip("netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _ip("netns", "del", ns, check=False)


def _clean_stale() -> None:
    """Remove the namespaces and bridges of test processes that died without removing them."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        if (
            len(parts) >= 3
            and parts[0] == PREFIX
            and parts[1].isdigit()
            and not process_alive(int(parts[1]))
        ):
            _remove_namespace(name)
    listing = _ip("-o", "link", "show", "type", "bridge", check=False).stdout
    for line in listing.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        alias = line.split(" alias ")[-1].strip() if " alias " in line else ""
        owner = alias.removeprefix(f"{PREFIX}-")
        mine = name.startswith("osb") and alias.startswith(f"{PREFIX}-") and owner.isdigit()
        if mine and not process_alive(int(owner)):
            _ip("link", "del", name, check=False)
