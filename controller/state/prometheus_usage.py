"""Per-pod GPU use read from Prometheus: the queries, the range to read, and its answer turned into samples.

The recommender's second source (issue 35) reads the series the node agent exports and
NVIDIA's dcgm-exporter names (``node/metrics.py``; docs/node-agent.md, "Per-pod GPU use"):

* duty cycle: ``DCGM_FI_DEV_GPU_UTIL`` in percent, or, for a pod on a MIG instance,
  ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (a ratio, times 100);
* memory: ``DCGM_FI_DEV_FB_USED`` in MiB;

each labelled ``namespace``, ``pod`` and ``container``. A pod with several GPUs has a series per
GPU: the queries keep the largest per pod and container (``max by``), the size one share of it
needs. A use the agent cannot attribute has no duty series, and its memory series is left out
where the agent says its memory is not the pod's own either (``gpupack_pod_gpu_memory_attributed``
0): such a pod is never resized. A use whose memory alone is the pod's own (an MPS client: NVML
gives its SM time to the MPS server) has memory, no duty, and the agent's
``gpupack_pod_gpu_use_attributed`` 0: a **memory-only** sample (``Sample`` with ``duty_percent``
None), which the source adds as the agent does (``sharing.usage.pod_history.add_sample``: memory
peaks, no observed time, and the pod's history memory-only from then on). Memory without a duty
cycle and without that mark is no sample (``unpaired``): a scrape that caught the agent between
setting one series and the next must not make a pod's compute unknown for its life, and
dcgm-exporter, which has no such mark, has every pod's duty cycle anyway.

**Memory-limit hits** are the agent's own (no dcgm-exporter series has them; ``node/metrics.py``):
``gpupack_pod_gpu_memory_limit_hits_total``, a counter of the hits it counted per pod container,
and ``gpupack_pod_gpu_memory_limit_bytes``, the limit in force. :func:`hits_of` turns the
counter's rises into one :class:`Hit` each, at the time it rose and with the limit then: read raw,
not through ``increase()`` (which extrapolates to fractions), a fall read as a reset (the agent
restarted: its new count is all new hits), the first value of a series taken as what was counted
before the read unless the pod was created within what the source has read (then from 0).

Pure: the I/O (HTTP, clock, logging) is ``controller.usage_prometheus``'s. Rules for bad input:

* An answer that is not Prometheus's JSON of a range query (``status``, ``data.resultType`` =
  ``matrix``, ``data.result`` a list of ``{"metric": {...}, "values": [[t, "v"], ...]}``) raises
  :class:`PrometheusAnswerError` naming what is wrong; an ``"error"`` status carries Prometheus's
  own ``errorType`` and ``error``.
* A value that is not a number, NaN or infinite (``nan``), below zero (``negative``) or beyond
  what a GPU can report (``absurd``: the trace reader's bounds, ``sharing.usage.trace``'s
  :data:`MAX_DUTY_PERCENT` and :data:`MAX_MEMORY_BYTES`) is dropped, as is the other signal's
  sample at that time (``unpaired``): a duty cycle without memory is nothing, and a dropped duty
  cycle does not make its memory a memory-only sample (only a time with no duty point that the
  agent marks does).
* A hit whose limit is not known at any time of the read is dropped (``hit_without_limit``).
* A series of a pod that is not among the live pods is skipped (``skipped_series``): it has no
  workload to credit (a pod that went, or one of another controller's namespaces).
* A time before the live pod's ``metadata.creationTimestamp`` is dropped (``before_pod``): the
  series is an earlier pod's of the same name (a StatefulSet's pod made again), whose use its
  own workload history already holds.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kube.times import parse_time
from sharing.api.fields import as_map
from sharing.api.gpunode import read_gpunode
from sharing.api.workload import workload_of
from sharing.usage.recommender import MIB, WorkloadKey
from sharing.usage.trace import MAX_DUTY_PERCENT, MAX_MEMORY_BYTES

SERIES_LABELS = ("namespace", "pod", "container")
"""The labels a pod's series carries (dcgm-exporter's and the agent's) and the queries keep."""
DUTY_METRIC = "DCGM_FI_DEV_GPU_UTIL"
ENGINE_ACTIVE_METRIC = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
MEMORY_METRIC = "DCGM_FI_DEV_FB_USED"
MEMORY_ATTRIBUTED_METRIC = "gpupack_pod_gpu_memory_attributed"
ATTRIBUTED_METRIC = "gpupack_pod_gpu_use_attributed"
LIMIT_HITS_METRIC = "gpupack_pod_gpu_memory_limit_hits_total"
LIMIT_BYTES_METRIC = "gpupack_pod_gpu_memory_limit_bytes"
DEVICE_LABELS = ("UUID", "GPU_I_ID")
"""The labels that tell a pod's series of one device from another's (dcgm-exporter's and the agent's)."""
MAX_POINTS = 11000
"""Prometheus refuses a range query of more points per series than this (its own limit)."""

SeriesKey = tuple[str, str, str]
"""(namespace, pod, container) of one series."""
Matrix = dict[SeriesKey, dict[float, float]]
"""A range query's answer: per series, time (Unix s) -> value (NaN where it was not a number)."""


class PrometheusAnswerError(ValueError):
    """Prometheus's answer is an error, or not the JSON of a range query; the message says which."""


def usage_queries(selector: str = "") -> tuple[str, str]:
    """The PromQL of the duty cycle (percent) and the memory (MiB) per pod and container.

    ``selector``: extra label matchers for every series read, e.g. ``job="gpupack-node-agent"``
    where dcgm-exporter's whole-device series share the names (docs/right-sizing.md)."""
    matchers, by = _matchers(selector), f"max by ({', '.join(SERIES_LABELS)})"
    duty = (f"{by} ({DUTY_METRIC}{{{matchers}}}) or "
            f"{by} ({ENGINE_ACTIVE_METRIC}{{{matchers}}}) * 100")
    # A device's memory the agent says is not the pod's own is left out (dcgm-exporter alone: none is).
    same = f"on ({', '.join((*SERIES_LABELS, *DEVICE_LABELS))})"
    memory = f"{by} ({MEMORY_METRIC}{{{matchers}}} unless {same} ({MEMORY_ATTRIBUTED_METRIC}{{{matchers}}} == 0))"
    return duty, memory


def compute_unattributed_query(selector: str = "") -> str:
    """The PromQL of the times a pod's compute is not its own, by the agent's mark (module docstring);
    ``selector`` as for :func:`usage_queries`."""
    return f"max by ({', '.join(SERIES_LABELS)}) ({ATTRIBUTED_METRIC}{{{_matchers(selector)}}} == 0)"


def limit_queries(selector: str = "") -> tuple[str, str]:
    """The PromQL of the memory-limit hit counter and of the limit in force (bytes) per pod and container,
    read raw (module docstring); ``selector`` as for :func:`usage_queries`."""
    matchers, by = _matchers(selector), f"max by ({', '.join(SERIES_LABELS)})"
    return f"{by} ({LIMIT_HITS_METRIC}{{{matchers}}})", f"{by} ({LIMIT_BYTES_METRIC}{{{matchers}}})"


def _matchers(selector: str) -> str:
    return 'pod!=""' + (f",{selector.strip().strip(',')}" if selector.strip() else "")


@dataclass(frozen=True)
class QueryRange:
    """Evaluation times ``start, start + step, ... <= end`` (Unix s)."""

    start: float
    end: float
    step: float

    @property
    def next_start(self) -> float:
        """Where the read after this one starts: no time is read twice."""
        return self.start + (math.floor((self.end - self.start) / self.step) + 1) * self.step


def range_to_read(next_s: float | None, now_s: float, step_s: float, lookback_s: float) -> QueryRange | None:
    """The times to read at ``now_s``: from ``next_s`` (the previous read's ``next_start``; the
    first read: ``now_s - lookback_s``), never further back than ``lookback_s`` nor more points
    than Prometheus answers; on the grid of multiples of ``step_s``, so every read evaluates the
    same instants (a lookback under one step reads one step back, or a read might never find a
    time on the grid). None when no step has passed since the previous read."""
    if step_s <= 0 or lookback_s < 0:
        raise ValueError(f"step must be positive and lookback not negative, got {step_s}, {lookback_s}")
    earliest = now_s - min(max(lookback_s, step_s), (MAX_POINTS - 1) * step_s)
    start = math.ceil(max(earliest, next_s if next_s is not None else earliest) / step_s) * step_s
    return QueryRange(start, now_s, step_s) if start <= now_s else None


def parse_matrix(answer: Any) -> Matrix:
    """A range query's decoded JSON answer, as series (module docstring, first rule)."""
    if not isinstance(answer, Mapping):
        raise PrometheusAnswerError(f"expected a JSON object, got {type(answer).__name__}")
    status = answer.get("status")
    if status == "error":
        raise PrometheusAnswerError(f"Prometheus answered {answer.get('errorType', 'an error')}: "
                                    f"{answer.get('error', '(no message)')}")
    if status != "success":
        raise PrometheusAnswerError(f"expected status 'success', got {status!r}")
    data = answer.get("data")
    if not isinstance(data, Mapping) or data.get("resultType") != "matrix":
        kind = data.get("resultType") if isinstance(data, Mapping) else data
        raise PrometheusAnswerError(f"expected data.resultType 'matrix' (a range query), got {kind!r}")
    result = data.get("result")
    if not isinstance(result, list):
        raise PrometheusAnswerError(f"expected data.result to be a list, got {type(result).__name__}")
    matrix: Matrix = {}
    for i, series in enumerate(result):
        where = f"data.result[{i}]"
        if not isinstance(series, Mapping):
            raise PrometheusAnswerError(f"{where}: expected an object, got {type(series).__name__}")
        labels, values = series.get("metric"), series.get("values")
        if not isinstance(labels, Mapping) or not isinstance(values, list):
            raise PrometheusAnswerError(f"{where}: expected 'metric' (an object) and 'values' (a list)")
        key = _series_key(labels, where)
        points = matrix.setdefault(key, {})
        for j, point in enumerate(values):
            if not (isinstance(point, list) and len(point) == 2 and isinstance(point[0], (int, float))
                    and not isinstance(point[0], bool) and math.isfinite(point[0])):
                raise PrometheusAnswerError(f"{where}.values[{j}]: expected [time, \"value\"], got {point!r}")
            points[float(point[0])] = _number(point[1])
    return matrix


def _series_key(labels: Mapping[str, Any], where: str) -> SeriesKey:
    values = [labels.get(name, "") for name in SERIES_LABELS]
    if not all(isinstance(v, str) for v in values) or not values[0] or not values[1]:
        raise PrometheusAnswerError(f"{where}: a pod's series needs string labels namespace and pod (and "
                                    f"container, possibly empty), got {dict(labels)!r}")
    return values[0], values[1], values[2]


def _number(value: Any) -> float:
    """Prometheus writes sample values as strings ("1.5", "NaN", "+Inf")."""
    try:
        return float(value) if isinstance(value, str) else math.nan
    except ValueError:
        return math.nan


@dataclass(frozen=True)
class Sample:
    """One time of one workload container: what ``Recommender.observe`` takes, and whose it is."""

    key: WorkloadKey
    time_s: float
    duty_percent: float | None
    """None: a memory-only sample (the pod's compute is not its own, module docstring)."""
    memory_bytes: int
    pod: str = ""
    """``namespace/name`` of the pod measured."""
    uid: str = ""
    """Its ``metadata.uid`` (empty when its object has none)."""


@dataclass(frozen=True)
class ReadCounts:
    """What one read held and what the rules did (module docstring)."""

    series: int = 0
    samples: int = 0
    memory_only: int = 0
    """Of ``samples``, those without a duty cycle."""
    skipped_series: int = 0
    dropped: Mapping[str, int] = field(default_factory=dict)
    """Values dropped by reason: ``nan``, ``negative``, ``absurd``, ``unpaired``, ``before_pod``,
    ``hit_without_limit``."""
    hits: int = 0
    """New memory-limit hits (:func:`hits_of`)."""


def samples_of(duty: Matrix, memory: Matrix, pods: Mapping[str, Mapping[str, Any]],
               compute_unattributed: Matrix | None = None) -> tuple[list[Sample], ReadCounts]:
    """The samples of the live ``pods`` (by ``namespace/name``) in the answers, in time order per series;
    ``compute_unattributed``: the times the agent marks a pod's compute as not its own (memory-only samples)."""
    marked = compute_unattributed or {}
    found: list[Sample] = []
    dropped: Counter[str] = Counter()
    skipped = 0
    keys = sorted(set(duty) | set(memory))
    for series in keys:
        live = _live_pod(series, pods)
        if live is None:
            skipped += 1
            continue
        key, uid, born_s = live
        duties, memories = duty.get(series, {}), memory.get(series, {})
        for time_s in sorted(set(duties) | set(memories)):
            if time_s < born_s:
                dropped["before_pod"] += 1
                continue
            d = _checked(duties.get(time_s), MAX_DUTY_PERCENT, dropped)
            m = _checked(None if (v := memories.get(time_s)) is None else v * MIB, float(MAX_MEMORY_BYTES), dropped)
            if m is None or (d is None and (time_s in duties or time_s not in marked.get(series, {}))):
                dropped["unpaired"] += (d is None) != (m is None)
                continue
            found.append(Sample(key, time_s, d, round(m), f"{series[0]}/{series[1]}", uid))
    memory_only = sum(1 for s in found if s.duty_percent is None)
    return found, ReadCounts(len(keys), len(found), memory_only, skipped, dict(dropped))


def _live_pod(series: SeriesKey, pods: Mapping[str, Mapping[str, Any]]) -> tuple[WorkloadKey, str, float] | None:
    """The workload container of ``series``'s live pod, the pod's uid and creation time (Unix s); None when
    the pod is not live."""
    ns, pod_name, container = series
    pod = pods.get(f"{ns}/{pod_name}")
    if pod is None:
        return None
    workload = workload_of(pod)
    meta = as_map(pod.get("metadata"))
    uid = meta.get("uid")
    created = parse_time(meta.get("creationTimestamp"))
    return (WorkloadKey(workload.namespace, workload.kind, workload.name, container),
            uid if isinstance(uid, str) else "", created.timestamp() if created is not None else -math.inf)


@dataclass(frozen=True)
class Hit:
    """One memory-limit hit of a live pod container, as ``Recommender.record_oom`` takes it."""

    key: WorkloadKey
    time_s: float
    limit_bytes: int
    pod: str
    """``namespace/name``"""
    uid: str


HitCounts = dict[tuple[str, str, str], float]
"""(``namespace/name``, pod uid, container) -> the hit counter's last value read."""


def hits_of(counters: Matrix, limits: Matrix, pods: Mapping[str, Mapping[str, Any]], counted: Mapping[
        tuple[str, str, str], float], read_from_s: float) -> tuple[list[Hit], HitCounts, Mapping[str, int]]:
    """The new hits of the live ``pods`` in one read of the counter and limit series (module docstring),
    the counters' last values for the next read, and what was dropped, by reason.

    ``counted``: the values the previous reads ended on; ``read_from_s``: the earliest time this source has
    read since it began (a pod created after it had its whole counter read: its first value counts)."""
    found: list[Hit] = []
    last: HitCounts = {}
    dropped: Counter[str] = Counter()
    for series in sorted(counters):
        live = _live_pod(series, pods)
        if live is None:
            continue
        key, uid, born_s = live
        pod = f"{series[0]}/{series[1]}"
        pod_key = (pod, uid, series[2])
        before = counted.get(pod_key, 0.0 if born_s >= read_from_s else None)
        known = sorted((t, v) for t, v in limits.get(series, {}).items() if t >= born_s and math.isfinite(v) and v > 0)
        for time_s, value in sorted(counters[series].items()):
            if time_s < born_s or not math.isfinite(value) or value < 0:
                continue
            new = 0 if before is None else round(value - before if value >= before else value)  # a fall: a reset
            before = value
            if new <= 0:
                continue
            limit = _limit_at(known, time_s)
            if limit is None:
                dropped["hit_without_limit"] += new
                continue
            found.extend(Hit(key, time_s, round(limit), pod, uid) for _ in range(new))
        if before is not None:
            last[pod_key] = before
    return found, last, dict(dropped)


def _limit_at(known: list[tuple[float, float]], time_s: float) -> float | None:
    """The limit in force at ``time_s``: the last known at or before it, else the first after it."""
    at_or_before = [v for t, v in known if t <= time_s]
    return at_or_before[-1] if at_or_before else known[0][1] if known else None


def gpu_memory_by_node(gpunodes: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Node name -> the memory (MiB) of its largest GPU, from the GPUNodes (``sharing.api.gpunode``): the
    cap of a size for a pod that runs there. The series say which GPU a pod used only by its UUID, and
    the queries keep none of it; a node's GPUs are one model in practice (GPU feature discovery labels
    a node with one product)."""
    out: dict[str, int] = {}
    for obj in gpunodes:
        reading = read_gpunode(obj)
        if reading is not None and reading.gpus:
            out[reading.name] = max(g.memory_mib for g in reading.gpus)
    return out


def _checked(value: float | None, limit: float, dropped: Counter[str]) -> float | None:
    if value is None:
        return None
    reason = "nan" if not math.isfinite(value) else "negative" if value < 0 else "absurd" if value > limit else None
    if reason is not None:
        dropped[reason] += 1
        return None
    return value


__all__ = ["ATTRIBUTED_METRIC", "DUTY_METRIC", "ENGINE_ACTIVE_METRIC", "Hit", "HitCounts", "LIMIT_BYTES_METRIC", "LIMIT_HITS_METRIC",
           "MEMORY_ATTRIBUTED_METRIC", "MEMORY_METRIC", "MAX_POINTS", "Matrix", "PrometheusAnswerError", "QueryRange",
           "ReadCounts", "SERIES_LABELS", "Sample", "SeriesKey", "compute_unattributed_query", "gpu_memory_by_node",
           "hits_of", "limit_queries",
           "parse_matrix", "range_to_read", "samples_of", "usage_queries"]
