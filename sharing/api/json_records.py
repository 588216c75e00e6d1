"""An annotation that holds one of gpupack's JSON records: the text read into an object, or why not.

gpupack's typed annotations (``sharing.api.allocation``, ``sharing.dra.pinned``) are
JSON objects; each module reads its own fields, and this is the one first step
they share, so a record that is not a string, not JSON or not an object is
refused in the same words everywhere.
"""

from __future__ import annotations

import json
from typing import Any


MAX_RECORD_CHARS = 65_536
"""Longest record annotation read (a record gpupack writes is a few hundred characters)."""


def json_record(text: object, key: str, error: type[ValueError]) -> dict[str, Any]:
    """The JSON object in annotation ``key``'s ``text``; ``error`` naming the problem otherwise."""
    if not isinstance(text, str):
        raise error(f"{key} is not a string")
    if len(text) > MAX_RECORD_CHARS:
        raise error(f"{key} is longer than {MAX_RECORD_CHARS} characters")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{key} is not JSON: {exc}") from None
    except RecursionError:  # a tenant's annotation nested past what the decoder recurses through
        raise error(f"{key} is nested too deep") from None
    if not isinstance(raw, dict):
        raise error(f"{key} is not a JSON object")
    return raw


def versioned_record(text: object, key: str, error: type[ValueError], version: str) -> dict[str, Any]:
    """:func:`json_record`, and its ``version`` field must be ``version`` (a reader must check it)."""
    raw = json_record(text, key, error)
    if raw.get("version") != version:
        raise error(f"{key} version {raw.get('version')!r:.32} is not {version!r}")
    return raw


def record_text(record: dict[str, Any]) -> str:
    """A record's annotation text: compact JSON, keys sorted (equal records, equal text)."""
    return json.dumps(record, separators=(",", ":"), sort_keys=True)
