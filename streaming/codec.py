"""JSON serialisation of what crosses Redis (orjson)."""

from __future__ import annotations

from typing import Any

import orjson


def dumps(obj: Any) -> bytes:
    """Compact JSON bytes (numpy arrays allowed)."""
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)


def loads(data: bytes | str) -> Any:
    """Parse JSON bytes or text."""
    return orjson.loads(data)
