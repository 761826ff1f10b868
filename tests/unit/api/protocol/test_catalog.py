"""api/protocol/catalog.py: the protocol's names as JSON and as the web client's ES module, and
the web client uses no name the server does not have."""

from __future__ import annotations

import re
from pathlib import Path

import orjson

from api.protocol.catalog import ENUMS, catalog, javascript_module
from api.protocol.errors import CLOSING_ERRORS, RESUME_ERRORS
from api.protocol.events import EXTENSIONS, ServerEvent
from streaming.events import ErrorCode

WEB = Path(__file__).resolve().parents[4] / "api" / "web"
EXPORT = re.compile(r"^export const (\w+) = Object\.freeze\((.*)\);$")
IMPORT = re.compile(r'import \{([^}]*)\} from "\./protocol\.js";')


def _module_exports() -> dict[str, object]:
    lines = javascript_module().splitlines()
    assert lines[0].startswith("//")
    exports = {}
    for line in lines[1:]:
        m = EXPORT.match(line)
        assert m, line
        exports[m[1]] = orjson.loads(m[2])
    return exports


def test_every_enum_is_published_by_name() -> None:
    cat = catalog()
    for enum in ENUMS:
        assert cat[enum.__name__] == {m.name: m.value for m in enum}
    assert cat["ServerEvent"]["RESPONSE_OUTPUT_DELTA"] == ServerEvent.RESPONSE_OUTPUT_DELTA
    assert cat["CLOSING_ERRORS"] == sorted(CLOSING_ERRORS)
    assert cat["RESUME_ERRORS"] == sorted(RESUME_ERRORS)
    assert cat["CLIENT_ERRORS"] == sorted(c for c in ErrorCode if c.is_client_error)
    assert cat["EXTENSIONS"] == sorted(EXTENSIONS)
    orjson.dumps(cat)  # plain JSON


def test_the_module_exports_the_catalog() -> None:
    assert _module_exports() == catalog()


def test_the_web_client_uses_only_names_the_server_has() -> None:
    exports = _module_exports()
    used = 0
    for path in sorted(WEB.glob("*.js")):
        text = path.read_text()
        imported = {n.split(" as ")[0].strip() for m in IMPORT.findall(text) for n in m.split(",")}
        imported.discard("")
        if not imported:
            continue
        assert imported <= exports.keys(), (path.name, imported - exports.keys())
        for enum, member in re.findall(r"\b(" + "|".join(imported) + r")\.([A-Z_]+)\b", text):
            values = exports[enum]
            assert isinstance(values, dict) and member in values, f"{path.name}: {enum}.{member}"
            used += 1
    assert used > 20  # realtime.js, messages.js, chat.js, duplex.js, status.js


def test_the_web_client_keeps_no_copy_of_the_codes() -> None:
    """Error codes, close reasons and event types come from protocol.js: no quoted copies."""
    names = {c.value for c in ErrorCode} | {e.value for e in ServerEvent if "." in e.value}
    for path in sorted(WEB.glob("*.js")):
        text = path.read_text()
        quoted = {n for n in names if f'"{n}"' in text or f"'{n}'" in text}
        assert not quoted, f"{path.name} spells {sorted(quoted)} itself"
