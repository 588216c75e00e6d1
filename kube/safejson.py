"""Decoding API answers whatever nesting the API server stores: one bad subtree never fails the document.

The API server stores JSON nested up to about 10,000 levels wherever a schema
keeps unknown fields (a CRD's ``x-kubernetes-preserve-unknown-fields``, a
ResourceClaim's opaque parameters). Python's ``json`` gives up near 1,000 levels
with ``RecursionError`` for the *whole* document: a watch event or a list page
holding one such object would fail every time, and the watch of that kind would
list again forever (issue 33, item 2). Readers past the decoder (``json.dumps``,
``copy.deepcopy``, pydantic) recurse too, so a depth the decoder survives can
still break them.

:func:`loads` is the one decoder every reader of watched objects uses. It
measures the depth at C speed first (strings removed by one regex, then
innermost bracket pairs peeled, one pass per level, at most :data:`MAX_DEPTH`
passes); a document within :data:`MAX_DEPTH` goes to ``json.loads`` unchanged.
A deeper one is pruned first: each subtree that starts deeper than the limit is
replaced by the string :data:`PRUNED`, so every other object of the document
still decodes, and the caller learns how many subtrees were cut
(:func:`holds_pruned` finds which object holds one).
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 100
"""Nesting kept, counted from the document's root (a watch event adds one level, a list two).
Kubernetes objects gpupack reads nest about 15 deep (managedFields included)."""

PRUNED = "<gpupack: pruned, nested deeper than 100 levels>"
"""What replaces a subtree that starts deeper than :data:`MAX_DEPTH`: a string where a reader
expects an object or a list, which a typed reader rejects."""

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_PAIR = re.compile(r"\{\}|\[\]")
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
_NOT_BRACKETS = {c: None for c in range(128) if chr(c) not in "[]{}"}


def _text(data: bytes | str) -> str:
    return data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data


def deeper_than(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether the JSON text nests containers more than ``limit`` deep (brackets inside strings not counted).

    Strings go first (one regex), then everything but brackets; each pass then removes the
    innermost ``{}``/``[]`` pairs, so a document ``d`` deep is empty after ``d`` passes.
    Non-ASCII characters outside strings are not JSON; ``json.loads`` rejects them later.
    """
    brackets = _STRING.sub("", text).translate(_NOT_BRACKETS)
    for _ in range(limit):
        if not brackets:
            return False
        shorter = _PAIR.sub("", brackets)
        if len(shorter) == len(brackets):
            return False  # unbalanced: not JSON, json.loads says why
        brackets = shorter
    return bool(brackets)


def prune(text: str, limit: int = MAX_DEPTH) -> tuple[str, int]:
    """The JSON text with every subtree starting deeper than ``limit`` replaced by :data:`PRUNED`; how many were cut.

    String-aware: brackets and escaped quotes inside strings are text, not structure.
    """
    pieces: list[str] = []
    depth, kept_from, cut_from, cuts = 0, 0, 0, 0
    marker = json.dumps(PRUNED)
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token[0] == '"':
            continue
        if token in "[{":
            depth += 1
            if depth == limit + 1:
                cut_from = match.start()
        else:
            if depth == limit + 1:
                pieces.append(text[kept_from:cut_from])
                pieces.append(marker)
                kept_from = match.end()
                cuts += 1
            depth -= 1
    if depth > limit:  # truncated document: cut the open subtree to its end; json.loads then says why
        pieces.append(text[kept_from:cut_from])
        kept_from = len(text)
        cuts += 1
    pieces.append(text[kept_from:])
    return "".join(pieces), cuts


def loads(data: bytes | str, limit: int = MAX_DEPTH) -> tuple[Any, int]:
    """Decode one API answer; the value and how many too-deep subtrees were replaced by :data:`PRUNED`.

    Raises ``ValueError`` (``json.JSONDecodeError``) for text that is not JSON, never ``RecursionError``.
    """
    text = _text(data)
    cuts = 0
    if deeper_than(text, limit):
        text, cuts = prune(text, limit)
    try:
        return json.loads(text), cuts
    except RecursionError:  # not reachable within MAX_DEPTH; kept so no caller ever sees it
        raise ValueError(f"JSON nested too deep to decode even after pruning at {limit} levels") from None


def holds_pruned(value: Any) -> bool:
    """Whether a decoded value holds :data:`PRUNED` anywhere (iterative: no recursion on any depth)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif item == PRUNED:
            return True
    return False


def list_items(data: bytes | str) -> tuple[list[dict[str, Any]], list[str]]:
    """The objects of a list answer, leaving out each one that held a too-deep subtree; and their names.

    For the direct lists readers make before (or instead of) an informer: one deep object
    costs the reader that object, never the list.
    """
    value, cuts = loads(data)
    raw = value.get("items") if isinstance(value, dict) else None
    items = [i for i in raw or [] if isinstance(i, dict)]
    if not cuts:
        return items, []
    kept, left_out = [], []
    for item in items:
        if holds_pruned(item):
            meta = item.get("metadata")
            meta = meta if isinstance(meta, dict) else {}
            left_out.append("/".join(str(p) for p in (meta.get("namespace"), meta.get("name")) if p))
        else:
            kept.append(item)
    return kept, left_out


__all__ = ["MAX_DEPTH", "PRUNED", "deeper_than", "holds_pruned", "list_items", "loads", "prune"]
