"""What a live replay costs: CPU and memory of gpupack's processes, and the API server's requests.

* **CPU seconds** of a process: user plus system time of it and its waited-for
  children (``/proc/<pid>/stat`` fields 14-17, in clock ticks), read at the start
  of the submissions and at their end; the replay reports the difference, so
  start-up is not counted. A component of several processes (the agents, when
  each node has its own) is the sum.
* **Peak RSS** of a process: ``VmHWM`` of ``/proc/<pid>/status`` (the kernel's
  high-water mark of its resident set, over its whole life), read at the end.
  For several processes it is the sum of their peaks: an upper bound on the
  peak of the sum.
* **API requests by verb**: the API server's ``apiserver_request_total``
  counter (its ``/metrics``, read as the admin), summed over every label but
  ``verb``, the difference between the start and end of the submissions. It
  counts every client: gpupack's components, kube-scheduler, kwok (node
  heartbeats, Leases, pod status) and the replay itself (its creates, deletes
  and watch, which it reports apart so they can be subtracted).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

PROC: Final = Path("/proc")
_TICKS: Final = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class ProcessSample:
    cpu_seconds: float
    peak_rss_mib: float


def sample(pid: int, proc: Path = PROC) -> ProcessSample | None:
    """CPU seconds so far and peak RSS of ``pid``; None if it is gone (or not readable)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
        status = (proc / str(pid) / "status").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after its last ')'.
    fields = stat[stat.rindex(")") + 2:].split()
    # fields[0] is field 3 (state); utime..cstime are fields 14..17.
    ticks = sum(int(x) for x in fields[11:15])
    match = re.search(r"^VmHWM:\s+(\d+)\s+kB", status, re.MULTILINE)
    hwm_kib = int(match.group(1)) if match else 0
    return ProcessSample(ticks / _TICKS, hwm_kib / 1024.0)


@dataclass(frozen=True)
class ComponentCost:
    cpu_seconds: float
    peak_rss_mib: float
    processes: int

    def as_json(self) -> dict[str, float | int]:
        return {"cpu_seconds": round(self.cpu_seconds, 2), "peak_rss_mib": round(self.peak_rss_mib, 1),
                "processes": self.processes}


def component_cost(before: Mapping[int, ProcessSample | None], after: Mapping[int, ProcessSample | None]) -> ComponentCost:
    """A component's cost from samples of its processes (by pid) at the start and the end. A process
    gone at the end counts nothing; one missing at the start counts all its CPU time."""
    cpu = peak = 0.0
    alive = 0
    for pid, end in after.items():
        if end is None:
            continue
        start = before.get(pid)
        cpu += end.cpu_seconds - (start.cpu_seconds if start is not None else 0.0)
        peak += end.peak_rss_mib
        alive += 1
    return ComponentCost(cpu, peak, alive)


def sample_all(pids: Iterable[int], proc: Path = PROC) -> dict[int, ProcessSample | None]:
    return {pid: sample(pid, proc) for pid in pids}


_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)", re.MULTILINE)
_VERB = re.compile(r'(?:^|,)verb="(?P<verb>[^"]*)"')


def requests_by_verb(metrics_text: str) -> dict[str, float]:
    """``apiserver_request_total`` summed per ``verb`` from the API server's Prometheus text."""
    out: dict[str, float] = {}
    for match in _SAMPLE.finditer(metrics_text):
        verb = _VERB.search(match.group("labels"))
        if verb is None:
            continue
        out[verb.group("verb")] = out.get(verb.group("verb"), 0.0) + float(match.group("value"))
    return out


def delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, int]:
    """Per key, ``after`` minus ``before`` (keys with no requests in between left out), sorted by key."""
    out = {k: int(round(v - before.get(k, 0.0))) for k, v in after.items()}
    return {k: v for k, v in sorted(out.items()) if v > 0}
