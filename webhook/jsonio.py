"""JSON in and out of the webhook: orjson when installed (several times faster on
the pod-sized documents of the request path), the standard library otherwise.
Both give the same values; only speed differs."""

from __future__ import annotations

import json
from typing import Any

try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised only where orjson is missing
    _orjson = None  # type: ignore[assignment]

BACKEND = "orjson" if _orjson is not None else "json"


class JSONDecodeError(ValueError):
    """The body is not valid JSON (either backend)."""


def loads(data: bytes) -> Any:
    try:
        if _orjson is not None:
            return _orjson.loads(data)
        return json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise JSONDecodeError(str(exc)[:200]) from None


def dumps(value: Any) -> bytes:
    if _orjson is not None:
        return _orjson.dumps(value)
    # ASCII escapes: a lone surrogate the stdlib parser let through stays valid JSON.
    return json.dumps(value, separators=(",", ":")).encode("ascii")
