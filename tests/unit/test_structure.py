"""The import structure: packages depend only downwards, and no module imports itself back.

Reads every module's imports (module level and inside functions) with ``ast``
(``tests/support/module_imports.py``); nothing is imported, so the check needs no ML stack.
"""

from __future__ import annotations

import graphlib
from pathlib import Path

import pytest

from tests.support.module_imports import ROOT, imports, module_name

PACKAGES = ("omnicore", "inference", "streaming", "api", "tasks", "omniserve", "bench")

# docs/ARCHITECTURE.md, "Dependency directions": what each package may import of ours.
ALLOWED = {
    "omnicore": set(),
    "inference": {"omnicore"},
    "streaming": {"omnicore"},
    "api": {"streaming", "omnicore"},
    "tasks": {"streaming", "inference", "omnicore"},
    "omniserve": {"api", "tasks", "streaming", "inference", "omnicore", "bench"},
    "bench": {"api", "streaming", "omnicore", "inference", "omniserve"},
}
# docs/ARCHITECTURE.md, "Inside the gateway": what each part of ``api/`` may import of the others.
# ``app`` (``api/app.py``) builds the app from the features; ``server`` runs it under uvicorn.
API_ALLOWED = {
    "protocol": set(),
    "metrics": {"protocol"},
    "security": set(),
    "recordings": {"protocol", "security"},
    "gateway": {"protocol", "metrics", "recordings"},
    "relay": {"gateway"},
    "realtime": {"protocol", "metrics", "security", "recordings", "gateway", "relay"},
    "ops": {"protocol", "gateway", "metrics", "security"},
    "official": {
        "protocol",
        "metrics",
        "security",
        "recordings",
        "gateway",
        "relay",
        "realtime",
        "ops",
    },
    "openai_realtime": {
        "protocol",
        "metrics",
        "security",
        "recordings",
        "gateway",
        "relay",
        "realtime",
    },
    "server": {"gateway", "metrics", "protocol"},
    "app": {"gateway", "official", "ops", "openai_realtime", "realtime", "recordings", "security"},
}
# Third-party packages that would pull an ML stack or worker code into a gateway.
GATEWAY_FORBIDDEN = {"torch", "transformers", "inference", "tasks", "celery.signals"}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            out[module_name(path)] = path
    return out


MODULES = _modules()


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_packages_import_only_downwards(package: str) -> None:
    wrong = []
    for name, path in MODULES.items():
        if name.split(".")[0] != package:
            continue
        for imported in imports(path):
            top = imported.split(".")[0]
            if top in ALLOWED and top != package and top not in ALLOWED[package]:
                wrong.append(f"{name} imports {imported}")
    assert not wrong, "\n".join(sorted(wrong))


def _api_part(name: str) -> str | None:
    """``api.realtime.chat`` -> ``realtime``; None for ``api`` itself and for other packages."""
    parts = name.split(".")
    return parts[1] if parts[0] == "api" and len(parts) > 1 else None


def test_every_api_module_lives_in_its_concern() -> None:
    api_modules = [name for name in MODULES if name.startswith("api.")]
    stray = sorted(name for name in api_modules if _api_part(name) not in API_ALLOWED)
    assert api_modules and not stray, f"api/ modules outside {sorted(API_ALLOWED)}: {stray}"


def test_the_parts_of_api_depend_in_one_direction() -> None:
    order = graphlib.TopologicalSorter(API_ALLOWED)
    order.prepare()  # raises CycleError when two parts may import each other
    unknown = {dep for deps in API_ALLOWED.values() for dep in deps} - API_ALLOWED.keys()
    assert not unknown, f"rules name parts that do not exist: {sorted(unknown)}"


@pytest.mark.parametrize("part", sorted(API_ALLOWED))
def test_api_parts_import_only_what_they_may(part: str) -> None:
    wrong = []
    for name, path in MODULES.items():
        if _api_part(name) != part:
            continue
        for imported in imports(path):
            other = _api_part(imported)
            if other is not None and other != part and other not in API_ALLOWED[part]:
                wrong.append(f"{name} imports {imported}")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_gateway_imports_no_ml_stack_and_no_worker_code() -> None:
    wrong = [
        f"{name} imports {imported}"
        for name, path in MODULES.items()
        if name.split(".")[0] in ("api", "streaming", "omnicore")
        for imported in imports(path)
        if imported.split(".")[0] in GATEWAY_FORBIDDEN or imported in GATEWAY_FORBIDDEN
    ]
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_cycles() -> None:
    graph = {
        name: {m for m in imports(path) if m in MODULES and m != name}
        for name, path in MODULES.items()
    }
    # a package's __init__ importing its own submodules is how packages re-export; not a cycle
    for name in graph:
        graph[name] = {m for m in graph[name] if not m.startswith(name + ".")}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)
