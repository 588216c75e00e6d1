"""Tiny usage traces in the GenTD26 format, written by a test into its own folder.

Tests never read the shared trace: they write what they need here, each pod a list of
``(duty cycle %, memory bytes)`` samples, one per step from ``first`` on.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from sharing.usage.trace import DUTY_FILE, MEMORY_FILE
from sharing.usage.trace_text import Samples, trace_texts

GIB = 2**30
__all__ = ["GIB", "Samples", "write_usage_trace"]


def write_usage_trace(folder: Path, pods: Mapping[str, Samples], *, step_s: float = 60.0, origin_s: float = 1000.0,
                      first: Mapping[str, int] | None = None) -> Path:
    """Write ``pods`` (name -> samples; pod ``name``'s first sample at step ``first[name]``, default 0) into
    ``folder`` as the trace's two files (``sharing.usage.trace_text``); returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    duty, memory = trace_texts(pods, step_s=step_s, origin_s=origin_s, first=first)
    (folder / DUTY_FILE).write_text(duty, encoding="utf-8")
    (folder / MEMORY_FILE).write_text(memory, encoding="utf-8")
    return folder
