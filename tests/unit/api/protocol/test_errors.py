"""api/protocol/errors.py: the error frame, and the errors after which the server closes."""

from __future__ import annotations

import re
from pathlib import Path

import orjson

from api.protocol.errors import CLOSING_ERRORS, RESUME_ERRORS, ErrorType, error_frame
from streaming.events import ErrorCode

PROTOCOL_MD = Path(__file__).resolve().parents[4] / "docs" / "PROTOCOL.md"
ROW = re.compile(r"^\| `([a-z_]+)` \| (client|server) \| ([^|]+) \|", re.M)


def test_closing_errors_are_those_docs_protocol_md_closes_after() -> None:
    text = PROTOCOL_MD.read_text().split("## Error codes", 1)[1].split("\n## ", 1)[0]
    rows = {code: (kind, close.strip()) for code, kind, close in ROW.findall(text)}
    assert rows.keys() == {c.value for c in ErrorCode}
    closing = {code for code, (_, close) in rows.items() if not close.startswith("no")}
    assert closing == CLOSING_ERRORS | RESUME_ERRORS
    assert not CLOSING_ERRORS & RESUME_ERRORS
    for code, (kind, _) in rows.items():
        assert ErrorCode(code).is_client_error == (kind == "client"), code


def test_error_frame_bytes() -> None:
    frame = error_frame(ErrorCode.QUEUE_FULL, "Queue full")
    assert orjson.dumps(frame) == (
        b'{"type":"error","error":{"code":"queue_full","message":"Queue full",'
        b'"type":"server_error"}}'
    )
    field = error_frame(ErrorCode.MISSING_FIELD, "missing required field type", "type")
    assert field["error"]["type"] == ErrorType.CLIENT_ERROR
    assert orjson.dumps(field).endswith(b'"type":"client_error","field":"type"}}')
