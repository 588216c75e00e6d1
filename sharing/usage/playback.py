"""Play a usage trace at a scaled time: what each trace pod uses at a moment, and who plays whom (pure).

The simulated NVML (``node.nvml.simulated``) gives each of its GPU processes the use of one pod
of a GenTD26 trace (read by ``sharing.usage.trace``, the one reader), so a simulated node shows
real use. This module holds the rules; the backend only asks them.

**Time.** ``time_scale`` trace seconds pass per second of the clock: at 60, one trace minute per
second, and the 22.8 hours of ``../shared/traces/genai-usage`` play in 22.8 minutes. At clock time
``now`` the trace is at step ``floor((now - start_s) * time_scale / step_s)`` of its grid (the
value in force is the last sample at or before that moment, as a sampled signal is held). Every
process of a node plays one timeline: a pod created late joins its trace pod where the trace is,
as a pod of a live replay created at its trace pod's scaled first sample starts at its beginning.

**Outside a trace pod's life** (before its first sample, after its last, and before ``start_s``)
its process idles: 0 % duty cycle, holding the memory of the pod's nearest sample (its first
before, its last after). It does not exit: the process is the pod's, and the pod runs on.

**Who plays whom.** A process is bound once, when first seen, and keeps its trace pod:

* explicitly, by the pod that owns it (``namespace/name``) through ``pods``: a trace pod listed
  there is played only by the pods that name it;
* otherwise, in order of appearance, by the first trace pod in :attr:`TracePlayer.order` (first
  sample, then name) that no running process plays and no mapping names; when every such trace pod
  is played, by the one played by the fewest processes, first in that order.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sharing.usage.trace import PodUsage, UsageTrace

MAPPING_COLUMNS = ("pod", "container_ip")


class PlaybackError(ValueError):
    """A playback that cannot be set up: the message names the setting or line and the problem."""


@dataclass(frozen=True)
class PlayedUse:
    """What one trace pod uses at one moment."""

    duty_percent: float
    memory_bytes: int
    live: bool
    """Within the trace pod's life; False while it idles before its first sample or after its last."""


class TracePlayer:
    """The use of each pod of ``trace`` at clock time ``now`` (see the module docstring)."""

    def __init__(self, trace: UsageTrace, *, time_scale: float, start_s: float,
                 pods: Mapping[str, str] | None = None) -> None:
        if not (math.isfinite(time_scale) and time_scale > 0):
            raise PlaybackError(f"usage time scale must be a number above 0 (trace seconds per second), "
                                f"got {time_scale}")
        if not math.isfinite(start_s):
            raise PlaybackError(f"usage trace start must be a finite time, got {start_s}")
        self.trace = trace
        self.time_scale = time_scale
        self.start_s = start_s
        self._by_name = {p.pod: p for p in trace.pods}
        self.pods = dict(pods or {})
        unknown = sorted(set(self.pods.values()) - set(self._by_name))
        if unknown:
            raise PlaybackError(f"pod mapping names trace pod(s) the trace does not hold: {', '.join(unknown[:5])}"
                                + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""))
        self.order: tuple[str, ...] = tuple(p.pod for p in sorted(trace.pods, key=lambda p: (p.first_step, p.pod)))
        """Trace pods in the order processes are bound to them: by first sample, then name."""
        mapped = set(self.pods.values())
        self._free_order = tuple(p for p in self.order if p not in mapped) or self.order

    def __contains__(self, trace_pod: object) -> bool:
        return trace_pod in self._by_name

    def step(self, now: float) -> int:
        """The trace step in force at clock time ``now`` (negative before ``start_s``)."""
        return math.floor((now - self.start_s) * self.time_scale / self.trace.step_s)

    def use(self, trace_pod: str, now: float) -> PlayedUse:
        """What ``trace_pod`` uses at ``now``; KeyError for a pod the trace does not hold."""
        pod: PodUsage = self._by_name[trace_pod]
        at = self.step(now) - pod.first_step
        if at < 0:
            return PlayedUse(0.0, pod.memory_bytes[0], False)
        if at >= len(pod.duty_percent):
            return PlayedUse(0.0, pod.memory_bytes[-1], False)
        return PlayedUse(pod.duty_percent[at], pod.memory_bytes[at], True)

    def choose(self, owner: str, playing: Iterable[str]) -> str:
        """The trace pod a newly seen process of pod ``owner`` plays; ``playing``: the trace pods the
        node's running processes play (one entry per process)."""
        if owner in self.pods:
            return self.pods[owner]
        count = dict.fromkeys(self._free_order, 0)
        for name in playing:
            if name in count:
                count[name] += 1
        return min(self._free_order, key=lambda name: count[name])  # min keeps the first of equals


def parse_pod_mapping(lines: Iterable[str], source: str) -> dict[str, str]:
    """A CSV of ``pod,container_ip`` (header first; ``pod`` is ``namespace/name``): which trace pod each
    named pod plays. ``PlaybackError`` naming ``source`` and the line for a missing column, a pod
    that is not ``namespace/name``, an empty trace pod, or a pod named twice."""
    reader = csv.reader(lines)
    header = [name.strip() for name in next(reader, [])]
    if any(c not in header for c in MAPPING_COLUMNS):
        raise PlaybackError(f"{source}:1: expected the columns {', '.join(MAPPING_COLUMNS)}, got {', '.join(header)}")
    at = {name: header.index(name) for name in MAPPING_COLUMNS}
    mapping: dict[str, str] = {}
    try:
        for row in reader:
            if not row:
                continue
            line = reader.line_num
            if len(row) != len(header):
                raise PlaybackError(f"{source}:{line}: expected {len(header)} fields, got {len(row)}")
            pod, trace_pod = row[at["pod"]].strip(), row[at["container_ip"]].strip()
            namespace, _, name = pod.partition("/")
            if not namespace or not name:
                raise PlaybackError(f"{source}:{line}: pod must be namespace/name, got {pod!r}")
            if not trace_pod:
                raise PlaybackError(f"{source}:{line}: empty container_ip")
            if pod in mapping:
                raise PlaybackError(f"{source}:{line}: pod {pod} is mapped twice")
            mapping[pod] = trace_pod
    except csv.Error as exc:
        raise PlaybackError(f"{source}: malformed CSV ({exc})") from None
    return mapping
