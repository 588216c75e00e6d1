"""The text of a usage trace in the GenTD26 format (the two files ``sharing.usage.trace`` reads).

One writer for whoever makes a trace of their own: the tests' builders
(``gpupack.testing.usage_traces``) and the demo's built-in trace (``gpupack.demo.rightsizing``).
Pure: it returns the files' text; the caller writes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Samples = Sequence[tuple[float, int]]
"""One pod's samples: (duty cycle %, memory bytes), one per step."""


def trace_texts(pods: Mapping[str, Samples], *, step_s: float = 60.0, origin_s: float = 1000.0,
                first: Mapping[str, int] | None = None) -> tuple[str, str]:
    """The duty-cycle file's and the memory file's text for ``pods`` (name -> samples; pod ``name``'s
    first sample at step ``first[name]``, default 0, of a grid of ``step_s`` from ``origin_s``). The
    memory file orders its columns differently, as the published one does."""
    duty = ["value,timestamp_anon,container_ip"]
    memory = ["timestamp_anon,value,container_ip"]
    for name, samples in pods.items():
        start = (first or {}).get(name, 0)
        for offset, (percent, used) in enumerate(samples):
            at = origin_s + (start + offset) * step_s
            duty.append(f"{percent},{at},{name}")
            memory.append(f"{at},{used},{name}")
    return "\n".join(duty) + "\n", "\n".join(memory) + "\n"
