"""The install: every core dependency is used."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
