"""Tiny usage traces in the GenTD26 format, written by a test into its own folder.

Tests never read the shared trace: they write what they need here, each pod a list of
``(duty cycle %, memory bytes)`` samples, one per step from ``first`` on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from sharing.usage.trace import DUTY_FILE, MEMORY_FILE

GIB = 2**30
Samples = Sequence[tuple[float, int]]


def write_usage_trace(folder: Path, pods: Mapping[str, Samples], *, step_s: float = 60.0, origin_s: float = 1000.0,
                      first: Mapping[str, int] | None = None) -> Path:
    """Write ``pods`` (name -> samples; pod ``name``'s first sample at step ``first[name]``, default 0) into
    ``folder`` as the trace's two files; returns ``folder``. The memory file orders its columns differently,
    as the published one does."""
    folder.mkdir(parents=True, exist_ok=True)
    duty = ["value,timestamp_anon,container_ip"]
    memory = ["timestamp_anon,value,container_ip"]
    for name, samples in pods.items():
        start = (first or {}).get(name, 0)
        for offset, (percent, used) in enumerate(samples):
            at = origin_s + (start + offset) * step_s
            duty.append(f"{percent},{at},{name}")
            memory.append(f"{at},{used},{name}")
    (folder / DUTY_FILE).write_text("\n".join(duty) + "\n", encoding="utf-8")
    (folder / MEMORY_FILE).write_text("\n".join(memory) + "\n", encoding="utf-8")
    return folder
