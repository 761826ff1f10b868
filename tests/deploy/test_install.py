"""The install: the pocket backend's PyTorch is the CPU build, and every core dependency is used.

``scripts/install-torch`` runs pip for real, with ``--dry-run --report`` (nothing is installed)
and ``--no-deps`` (torch's own requirements are read from the wheel's metadata, so no network is
needed), as on a user's machine: no pip configuration, PyPI the index. PyPI's Linux torch wheel
is the CUDA build (it requires nvidia-*, cuda-* and triton packages); the script must take the
CPU build from ``OMNISERVE_TORCH_INDEX`` (here a local index), or a wheel that pip is offered
locally, without asking that index. The wheel both tests offer is the CPU wheel this machine's
pip configuration offers from local files; where there is none, they are skipped.
"""

from __future__ import annotations

import ast
import functools
import http.server
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install-torch"
CUDA_PREFIXES = ("nvidia-", "cuda-", "triton")


def _pin() -> str:
    found = re.search(r'^pin="(torch==[^"]+)"$', SCRIPT.read_text(), re.MULTILINE)
    assert found, "scripts/install-torch names no torch pin"
    return found.group(1)


def _dry_run(cmd: list[str], env: dict[str, str], report: Path) -> list[dict[str, Any]]:
    """Run a pip install command with a dry-run report; the packages it would install."""
    args = ["--dry-run", "--ignore-installed", "--no-deps", "--report", str(report)]
    done = subprocess.run(
        [*cmd, *args], env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return list(json.loads(report.read_text())["install"])


@functools.cache
def _local_wheel() -> Path | None:
    """The torch wheel of the pin that this machine's pip configuration offers from local files."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            found = _dry_run(
                [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", _pin()],
                dict(os.environ),
                Path(tmp) / "report.json",
            )
        except AssertionError:  # pip found no local wheel
            return None
    url = urlparse(found[0]["download_info"]["url"])
    return Path(unquote(url.path)) if url.scheme == "file" else None


@pytest.fixture
def wheel() -> Path:
    path = _local_wheel()
    if path is None:
        pytest.skip(f"pip is offered no local wheel of {_pin()} here")
    return path


class _Index(http.server.SimpleHTTPRequestHandler):
    """A PEP 503 index served from a directory, noting every path it is asked for."""

    asked: list[str]

    def log_message(self, format: str, *args: Any) -> None:
        self.asked.append(self.path)


@pytest.fixture
def index(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """(base URL, paths asked) of an index server on loopback that has no project."""
    root = tmp_path / "served"
    root.mkdir()
    asked: list[str] = []
    handler = type("Handler", (_Index,), {"asked": asked})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(handler, directory=str(root))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


def _user_env(**extra: str) -> dict[str, str]:
    """This environment without pip configuration (a user's machine), waiting on nothing long."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PIP_") and k != "OMNISERVE_TORCH_INDEX"
    }
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_DEFAULT_TIMEOUT="20",
        PIP_RETRIES="1",
    )
    env.update(extra)
    return env


def _requires(package: dict[str, Any]) -> list[str]:
    """The package's requirements outside any extra."""
    return [r for r in package["metadata"].get("requires_dist", []) if "extra ==" not in r]


def test_without_a_local_wheel_torch_comes_from_the_cpu_index(wheel: Path, tmp_path: Path) -> None:
    """A user's machine: the CPU build from OMNISERVE_TORCH_INDEX, never PyPI's CUDA build."""
    project = tmp_path / "cpu" / "torch"
    project.mkdir(parents=True)
    (project / wheel.name).symlink_to(wheel)
    (project / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>')
    env = _user_env(OMNISERVE_TORCH_INDEX=(tmp_path / "cpu").as_uri() + "/")
    [torch] = _dry_run([str(SCRIPT), sys.executable], env, tmp_path / "report.json")
    assert torch["metadata"]["name"] == "torch"
    assert torch["download_info"]["url"] == (project / wheel.name).as_uri()
    cuda = [r for r in _requires(torch) if r.lower().startswith(CUDA_PREFIXES)]
    assert not cuda, f"the torch wheel installed requires CUDA packages: {cuda}"


def test_a_local_wheel_is_used_without_asking_the_torch_index(
    wheel: Path, index: tuple[str, list[str]], tmp_path: Path
) -> None:
    """The local-file case (this machine, CI): the PyTorch index is never asked, so an index
    that cannot be reached costs nothing."""
    base, asked = index
    links = tmp_path / "wheels"
    links.mkdir()
    (links / wheel.name).symlink_to(wheel)
    env = _user_env(
        PIP_FIND_LINKS=str(links),
        PIP_INDEX_URL=f"{base}/usual/",  # the usual index: answers 404, the local wheel suffices
        OMNISERVE_TORCH_INDEX=f"{base}/torch-index/",
    )
    [torch] = _dry_run([str(SCRIPT), sys.executable], env, tmp_path / "report.json")
    assert torch["download_info"]["url"] == (links / wheel.name).as_uri()
    assert asked and not [p for p in asked if p.startswith("/torch-index/")], asked


# Core dependencies that no module imports because they are run as programs.
RUN_NOT_IMPORTED = {"flower": "`celery flower`, started by `omniserve up --flower`"}


def _imported_top_levels() -> set[str]:
    found: set[str] = set()
    for package in ("api", "streaming", "tasks", "inference", "omnicore", "omniserve", "bench"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    found.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    found.add(node.module.split(".")[0])
    return found


def test_every_core_dependency_is_imported() -> None:
    """A core dependency is installed everywhere (gateways, workers): each must be used."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    imported = _imported_top_levels()
    providers = importlib.metadata.packages_distributions()
    unused = []
    for requirement in pyproject["project"]["dependencies"]:
        name = re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0]
        canonical = re.sub(r"[-_.]+", "-", name).lower()
        modules = {
            module
            for module, dists in providers.items()
            if canonical in {re.sub(r"[-_.]+", "-", d).lower() for d in dists}
        }
        if canonical not in RUN_NOT_IMPORTED and not modules & imported:
            unused.append(name)
    assert not unused, f"core dependencies nothing imports: {unused}"
