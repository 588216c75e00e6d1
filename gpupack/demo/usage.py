"""What the demo shows of the pods' GPU use while its agents play a usage trace (``--usage-trace``).

Read from the agents' own per-pod series (docs/node-agent.md, "Per-pod GPU use") over HTTP, as
Prometheus would scrape them: what the demo shows is what the agents export.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

UTIL, MEMORY, ATTRIBUTED = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "gpupack_pod_gpu_use_attributed"
PodKey = tuple[str, str]
"""(namespace, pod)"""


def pod_series(url: str) -> dict[PodKey, dict[str, float]]:
    """Each pod's series on the agent's metrics endpoint at ``url``, by name; a pod on several devices gets
    its compute and memory summed and ``attributed`` 1 only if every one is. ``OSError`` (``URLError``
    among them) when the agent does not answer."""
    with urllib.request.urlopen(url, timeout=2) as response:
        text = response.read().decode()
    found: dict[PodKey, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            pod = (sample.labels.get("namespace", ""), sample.labels.get("pod", ""))
            if pod[1] and sample.name in (UTIL, MEMORY, ATTRIBUTED):
                series = found.setdefault(pod, {})
                held = series.get(sample.name)
                series[sample.name] = sample.value if held is None else (
                    min(held, sample.value) if sample.name == ATTRIBUTED else held + sample.value)
    return found


@dataclass(frozen=True)
class PodUse:
    """The pods' use over the scraped agents."""

    pods: int
    """Pods with a per-pod series."""
    measured: int
    """Pods whose compute use is measured (attributed, with a ``DCGM_FI_DEV_GPU_UTIL``)."""
    mean_util_percent: float | None
    """Mean ``DCGM_FI_DEV_GPU_UTIL`` of the measured pods."""
    memory_gib: float
    """Sum of ``DCGM_FI_DEV_FB_USED``."""

    def line(self) -> str:
        mean = "-" if self.mean_util_percent is None else f"{self.mean_util_percent:.1f}%"
        return (f"use: {self.pods} pods, {self.measured} measured, mean GPU util {mean}, "
                f"GPU memory {self.memory_gib:.1f} GiB")


def scrape(urls: Iterable[str]) -> PodUse:
    """The per-pod series of every agent at ``urls``; an agent that does not answer counts nothing."""
    pods: dict[PodKey, dict[str, float]] = {}
    for url in urls:
        try:
            pods.update(pod_series(url))
        except (urllib.error.URLError, OSError):
            continue
    measured = [s[UTIL] for s in pods.values() if s.get(ATTRIBUTED) == 1.0 and UTIL in s]
    return PodUse(len(pods), len(measured), sum(measured) / len(measured) if measured else None,
                  sum(s.get(MEMORY, 0.0) for s in pods.values()) / 1024)
