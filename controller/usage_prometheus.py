"""The recommender's Prometheus source: per-pod GPU use read from a Prometheus server's HTTP API.

For clusters that already scrape per-pod GPU series (gpupack's node agents, or NVIDIA's
dcgm-exporter): each ``feed`` asks ``/api/v1/query_range`` for the duty cycle and memory of
every pod (and the agent's mark of a compute not the pod's own, its memory-limit hits and limits)
since its previous read, one point per the recommender's sample interval, and adds each live
pod's samples to that pod container's own history (``controller.state.prometheus_usage`` says
which series, and the rules for bad values). The first read goes ``lookback_s`` back.

The pods' histories go to the bookkeeping both sources share
(``controller.state.workload_histories``): a pod that is no longer among the live pod objects has
gone, and its history is folded into its workload's gone part, which the recommender loop keeps
in the ``GPURecommendation``'s checkpoint. **Nothing is counted twice across a restart:** a
checkpoint holds only pods that have gone, whose series are no longer read (a series counts only
for a live pod, and only from that pod's creation); a new leader (:meth:`restore`) reads the live
pods again from ``lookback_s`` back into empty histories.

Each sample goes into its pod's history by the rule the agent follows
(``sharing.usage.pod_history.add_sample``): a memory-only one (an MPS client's) adds its memory
peak and makes the pod's history memory-only for its life. Each new memory-limit hit the agent
counted (its ``gpupack_pod_gpu_memory_limit_hits_total``) raises the pod's memory at once, as the
agents source does (``sharing.usage.pod_history.record_hit``: ``Recommender.record_oom``'s bump of
the limit in force).

The GPU memory a pod ran on (the size's cap) is its node's largest GPU's, from the GPUNodes
(``gpunodes``).

A read that fails (Prometheus unreachable, an HTTP error, an answer that is not a range query's
JSON) changes nothing: the recommender keeps its histories, the next read retries the same
times (as far back as ``lookback_s``), and the failure is logged once per kind, with a line
when reads work again. It never raises into the controller. Pods that go meanwhile are still
folded.

It meets ``controller.usage_source.UsageSource`` structurally (``source``, ``workloads``,
``unattributed``, ``feed``, ``restore``).
"""

from __future__ import annotations

import http.client
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import replace
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

from controller.state.prometheus_usage import (
    Hit,
    HitCounts,
    Matrix,
    PrometheusAnswerError,
    QueryRange,
    ReadCounts,
    Sample,
    compute_unattributed_query,
    gpu_memory_by_node,
    hits_of,
    limit_queries,
    parse_matrix,
    range_to_read,
    samples_of,
    usage_queries,
)
from controller.state.workload_histories import GonePart, PodHistory, PodKey, WorkloadHistories
from sharing.api.crd import RecommendationSource
from sharing.api.fields import as_map
from sharing.usage.pod_history import add_sample, record_hit
from sharing.usage.recommender import ContainerHistory, Recommender, RecommenderSettings

log = logging.getLogger("gpupack.controller.usage")

QUERY_RANGE_PATH = "/api/v1/query_range"
FailureKind = Literal["unreachable", "http", "malformed"]


class _ReadFailed(Exception):
    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class PrometheusUsageSource:
    """Per-pod use from Prometheus (module docstring)."""

    source: RecommendationSource = "Prometheus"

    def __init__(self, url: str, *, selector: str = "", lookback_s: float = 86400.0, timeout_s: float = 10.0,
                 gpunodes: Callable[[], Sequence[Mapping[str, Any]]] = tuple,
                 settings: RecommenderSettings | None = None) -> None:
        """``gpunodes``: lists the GPUNodes (for the GPU memory pods ran on; none: unknown, the size is
        then capped at its own memory); ``settings``: the recommender's (the shape of the histories)."""
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"the Prometheus URL must be http(s)://host[:port][/path], got {url!r}")
        if lookback_s < 0 or timeout_s <= 0:
            raise ValueError(f"lookback must not be negative and the timeout positive, got {lookback_s}, {timeout_s}")
        self.url = url.rstrip("/")
        self.lookback_s = lookback_s
        self.timeout_s = timeout_s
        self.duty_query, self.memory_query = usage_queries(selector)
        self.unattributed_query = compute_unattributed_query(selector)
        self.hits_query, self.limit_query = limit_queries(selector)
        self.next_s: float | None = None
        """Where the next read starts (None: not read yet)."""
        self.read_from_s: float | None = None
        """Where the first read of this term started (``prometheus_usage.hits_of``)."""
        self.hit_counts: HitCounts = {}
        """Each live pod container's hit counter as the last read ended."""
        self.memory_only: set[PodKey] = set()
        """Live pod containers whose compute was once not their own (``add_sample``'s mark)."""
        self.last_counts = ReadCounts()
        """What the last successful read held (``ReadCounts``)."""
        self._failing: FailureKind | None = None
        self.gpunodes = gpunodes
        self.workloads = WorkloadHistories(settings or RecommenderSettings())
        self.unattributed: dict[str, str] = {}
        """Always empty: an unattributed use has no duty series to tell it by
        (``controller.state.prometheus_usage``)."""

    def restore(self, parts: Iterable[GonePart]) -> None:
        """A leader's term begins from the checkpoints' gone parts; the live pods are read again, from
        ``lookback_s`` back (module docstring)."""
        self.workloads.reset(parts)
        self.next_s = self.read_from_s = None
        self.hit_counts, self.memory_only = {}, set()

    def feed(self, recommender: Recommender, pods: Mapping[str, Mapping[str, Any]], now_s: float) -> None:
        """Bring the recommender's histories up to ``now_s`` (Unix s) from Prometheus; ``pods``: the live
        pod objects by ``namespace/name``. Never raises for Prometheus's faults (module docstring)."""
        live = {key: pod for key, pod in self.workloads.live.items() if _is_live(key, pods)}
        window = range_to_read(self.next_s, now_s, recommender.settings.sample_interval_s, self.lookback_s)
        read = None if window is None else self._read(window, pods)
        if window is not None and read is not None:
            samples, hits = read
            for s in samples:
                pod_key = (s.pod, s.uid, s.key.container)
                found = self._pod(live, pod_key, s)
                history = add_sample(found.history, self.workloads.settings, s.time_s, s.duty_percent,
                                     s.memory_bytes, was_memory_only=pod_key in self.memory_only)
                if s.duty_percent is None:
                    self.memory_only.add(pod_key)
                if history is not found.history:
                    live[pod_key] = PodHistory(found.key, history, found.gpu_memory_mib)
            for hit in hits:
                found = self._pod(live, (hit.pod, hit.uid, hit.key.container), hit)
                record_hit(found.history, self.workloads.settings, hit.time_s, hit.limit_bytes)
            self.next_s = window.next_start
        self.hit_counts = {key: count for key, count in self.hit_counts.items() if _is_live(key, pods)}
        self.memory_only = {key for key in self.memory_only if _is_live(key, pods)}
        self.workloads.update(self._with_gpu_memory(live, pods), recommender)

    def _pod(self, live: dict[PodKey, PodHistory], pod_key: PodKey, of: Sample | Hit) -> PodHistory:
        """The live pod container's history, begun empty when it has none yet."""
        found = live.get(pod_key)
        if found is None:
            found = live[pod_key] = PodHistory(of.key, ContainerHistory(self.workloads.settings), 0)
        return found

    def _read(self, window: QueryRange, pods: Mapping[str, Mapping[str, Any]]
              ) -> tuple[list[Sample], list[Hit]] | None:
        """The samples and new hits of ``window``; None when the read failed (logged once per kind)."""
        try:
            duty = self._query(self.duty_query, window)
            memory = self._query(self.memory_query, window)
            unattributed = self._query(self.unattributed_query, window)
            counters = self._query(self.hits_query, window)
            limits = self._query(self.limit_query, window)
        except _ReadFailed as failed:
            if self._failing != failed.kind:
                log.warning("usage from Prometheus: %s; recommendations keep their history and the read is "
                            "retried", failed)
            self._failing = failed.kind
            return None
        if self._failing is not None:
            log.info("usage from Prometheus: %s answers again", self.url)
            self._failing = None
        samples, counts = samples_of(duty, memory, pods, unattributed)
        if self.read_from_s is None:
            self.read_from_s = window.start
        hits, last, dropped = hits_of(counters, limits, pods, self.hit_counts, self.read_from_s)
        self.hit_counts.update(last)
        self.last_counts = replace(counts, hits=len(hits), dropped={**counts.dropped, **dropped})
        log.debug("usage from Prometheus: %s", self.last_counts)
        return samples, hits

    def _with_gpu_memory(self, live: dict[PodKey, PodHistory], pods: Mapping[str, Mapping[str, Any]]
                         ) -> dict[PodKey, PodHistory]:
        """``live``, each pod's GPU memory found where still unknown (the GPUNodes are read only then)."""
        unknown = [key for key, pod in live.items() if not pod.gpu_memory_mib]
        if not unknown:
            return live
        memory = gpu_memory_by_node(self.gpunodes())
        for key in unknown:
            node = as_map(as_map(pods.get(key[0])).get("spec")).get("nodeName")
            if isinstance(node, str) and memory.get(node):
                pod = live[key]
                live[key] = PodHistory(pod.key, pod.history, memory[node])
        return live

    def _query(self, query: str, window: QueryRange) -> Matrix:
        params = urllib.parse.urlencode({"query": query, "start": repr(window.start), "end": repr(window.end),
                                         "step": repr(window.step)})
        request = urllib.request.Request(self.url + QUERY_RANGE_PATH, data=params.encode(), method="POST",
                                         headers={"Content-Type": "application/x-www-form-urlencoded"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310 - http(s) only
                body = response.read()
        except urllib.error.HTTPError as exc:
            # Prometheus explains a refused query (400, 422, 503) in a JSON body: say what it said.
            detail = _error_of(exc.read())
            raise _ReadFailed("http", f"{self.url} answered HTTP {exc.code}{detail}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:  # refused, timed out, cut off
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            raise _ReadFailed("unreachable", f"cannot reach {self.url} ({reason})") from None
        try:
            return parse_matrix(json.loads(body))
        except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError and PrometheusAnswerError too
            what = exc if isinstance(exc, PrometheusAnswerError) else f"not JSON ({exc})"
            raise _ReadFailed("malformed", f"{self.url}{QUERY_RANGE_PATH} answered {what}") from None


def _is_live(key: PodKey, pods: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether the pod container ``key`` is still among the live ``pods`` (the same pod, not a new one of its name)."""
    pod = pods.get(key[0])
    return pod is not None and (as_map(pod.get("metadata")).get("uid") or "") == key[1]


def _error_of(body: bytes) -> str:
    try:
        parse_matrix(json.loads(body))
    except PrometheusAnswerError as exc:
        return f": {exc}"
    except ValueError:
        pass
    return ""


__all__ = ["PrometheusUsageSource", "QUERY_RANGE_PATH"]
