"""Marked sections of benchmarks/RESULTS.md: each benchmark script owns one and keeps the others.

A section runs from its begin marker to its end marker (HTML comments, invisible when
rendered). A script rewriting RESULTS.md reads the sections it does not own first and
puts them back, so running one benchmark never drops another's figures.
"""

from __future__ import annotations

from pathlib import Path


def marked_section(results: Path, begin: str, end: str) -> str:
    """The section between ``begin`` and ``end`` (markers included) of ``results``, or "" when it has none."""
    if not results.exists():
        return ""
    text = results.read_text()
    if begin not in text or end not in text:
        return ""
    return text[text.index(begin) : text.index(end) + len(end)]


def with_marked_section(text: str, section: str, begin: str, end: str, after: str | None = None) -> str:
    """``text`` with ``section`` replacing its ``begin``..``end`` section; when it has none, the section
    goes after the marker ``after`` if ``text`` holds it, else after the title line."""
    if not section:
        return text
    if begin in text and end in text:
        return text[: text.index(begin)] + section + text[text.index(end) + len(end) :]
    if after is not None and after in text:
        at = text.index(after) + len(after)
        return f"{text[:at]}\n\n{section}\n\n{text[at:].lstrip(chr(10))}"
    title, _, rest = text.partition("\n")
    return f"{title}\n\n{section}\n{rest}"
