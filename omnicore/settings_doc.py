"""docs/CONFIGURATION.md's settings tables, rendered from ``Settings`` itself.

Why: a table copied by hand drifts from the code; this one is written from the fields' names,
types, defaults and descriptions, grouped by the ``# --- Title`` comments of the class, so
``python -m omnicore.settings_doc`` brings the document back in line and a test tells when it is
not. The document's hand-written introduction, everything above ``MARKER``, is kept as it is.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import re
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import IPvAnyNetwork, SecretStr
from pydantic.fields import FieldInfo

from omnicore import settings as settings_module
from omnicore.settings import Settings, environment_variables

DOC = Path(__file__).resolve().parent.parent / "docs" / "CONFIGURATION.md"
COMMAND = "python -m omnicore.settings_doc"
MARKER = (
    "<!-- Everything below is generated from omnicore/settings.py by"
    f" `{COMMAND}`: edit the fields' descriptions there, not this text. -->"
)

_TYPE_NAMES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    SecretStr: "secret string",
    IPvAnyNetwork: "network",
}
_BOUNDS = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"))


class UndocumentedSettings(ValueError):
    """Fields without a description: the document would have an empty cell for each."""


def undocumented() -> list[str]:
    """Names of the settings fields that have no description."""
    return [
        name for name, info in Settings.model_fields.items() if not (info.description or "").strip()
    ]


def groups() -> list[tuple[str, list[str]]]:
    """The fields in declaration order, under the ``# --- Title`` comment above each."""
    source = inspect.getsource(settings_module)
    headers = {
        number: found.group(1).strip()
        for number, line in enumerate(source.splitlines(), start=1)
        if (found := re.match(r"\s*# --- (.+)", line))
    }
    tree = ast.parse(source)
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Settings").body
    lines = {
        node.target.id: node.lineno
        for node in body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }
    out: list[tuple[str, list[str]]] = []
    for name in Settings.model_fields:
        above = [n for n in headers if n < lines.get(name, 0)]
        title = headers[max(above)] if above else "Other"
        if not out or out[-1][0] != title:
            out.append((title, []))
        out[-1][1].append(name)
    return out


def type_name(annotation: Any) -> str:
    """How a field's type reads in the document (list and object values are JSON)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return " or ".join(type_name(a) for a in rest) + ", optional"
    if origin is list:
        return f"JSON list of {type_name(args[0])}s"
    if origin is dict:
        return "JSON object"
    return _TYPE_NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))


def bounds(info: FieldInfo) -> str:
    """The field's numeric bounds, ``≥ 0``, ``> 0``, ``≤ 2000``."""
    found = []
    for attribute, sign in _BOUNDS:
        for item in info.metadata:
            value = getattr(item, attribute, None)
            if value is not None:
                found.append(f"{sign} {value}")
    return ", ".join(found)


def default_text(info: FieldInfo) -> str:
    """The default as it would be written in the environment (``unset`` for none)."""
    value = info.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list | dict):
        return f"`{json.dumps(value)}`"
    return f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render_tables() -> str:
    """The generated part of the document: one table per group of settings."""
    missing = undocumented()
    if missing:
        raise UndocumentedSettings(
            "these settings fields have no Field(description=...): " + ", ".join(missing)
        )
    parts = []
    for title, names in groups():
        rows = [
            f"## {title}",
            "",
            "| field | environment variable | type | default | description |",
            "|---|---|---|---|---|",
        ]
        for name in names:
            info = Settings.model_fields[name]
            kind = type_name(info.annotation)
            limit = bounds(info)
            cells = [
                f"`{name}`",
                ", ".join(f"`{v}`" for v in environment_variables(name)),
                f"{kind} {limit}" if limit else kind,
                default_text(info),
                info.description or "",
            ]
            rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        parts.append("\n".join(rows))
    return "\n\n".join(parts) + "\n"


def document(current: str) -> str:
    """``current`` (the document as it is) with its generated part written anew."""
    intro, found, _ = current.partition(MARKER)
    if not found:
        raise ValueError(f"{DOC.name} has no line {MARKER!r}: the generated part goes below it")
    return intro + MARKER + "\n\n" + render_tables()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", type=Path, default=DOC)
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 when the file is stale"
    )
    args = parser.parse_args(argv)
    current = args.path.read_text(encoding="utf-8")
    try:
        wanted = document(current)
    except ValueError as exc:
        print(f"{COMMAND}: {exc}", file=sys.stderr)
        return 1
    if wanted == current:
        return 0
    if args.check:
        print(f"{args.path} is out of date with omnicore/settings.py; run {COMMAND}")
        return 1
    args.path.write_text(wanted, encoding="utf-8")
    print(f"wrote {args.path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
