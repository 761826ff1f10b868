"""The tests' own layout: they mirror the code, and no test file imports another.

A helper that two test files need lives in ``tests/support/<concept>.py``; a test file that imported
another would run the other's module-level code and tie the two files' fixtures together.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.module_imports import ROOT, imports, module_name

TESTS = ROOT / "tests"
SUPPORT = TESTS / "support"
# what checks the tree as a whole rather than one module
WHOLE_TREE = {"test_structure.py", "test_test_layout.py"}


def _test_tree() -> list[Path]:
    """Every Python file under tests/ (the web client's node_modules is not walked)."""
    found = []
    for folder, subfolders, files in os.walk(TESTS):
        subfolders[:] = [d for d in subfolders if d not in ("node_modules", "__pycache__")]
        found += [Path(folder) / name for name in files if name.endswith(".py")]
    return sorted(found)


def test_no_test_file_imports_another() -> None:
    wrong = [
        f"{module_name(path)} imports {imported}"
        for path in _test_tree()
        for imported in imports(path)
        if imported.split(".")[0] == "tests"
        and imported not in ("tests", "tests.support")
        and not imported.startswith("tests.support.")
    ]
    assert not wrong, "import it from a tests/support/ module instead:\n" + "\n".join(wrong)


def test_helpers_live_in_tests_support() -> None:
    stray = [
        str(path.relative_to(ROOT))
        for path in _test_tree()
        if not path.is_relative_to(SUPPORT)
        and not path.name.startswith("test_")
        and path.name not in ("conftest.py", "__init__.py")
    ]
    assert not stray, f"not a test file, so it belongs in tests/support/: {stray}"


def test_each_unit_test_file_mirrors_a_module() -> None:
    """``tests/unit/<package>/test_<module>.py`` tests ``<package>/<module>.py`` (or a package)."""
    orphans = []
    for path in sorted((TESTS / "unit").rglob("test_*.py")):
        if path.name in WHOLE_TREE:
            continue
        code = ROOT / path.parent.relative_to(TESTS / "unit") / path.name.removeprefix("test_")
        if not code.is_file() and not code.with_suffix("").is_dir():
            orphans.append(str(path.relative_to(ROOT)))
    assert not orphans, f"no module of that name and place: {orphans}"
