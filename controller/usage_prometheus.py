"""The recommender's Prometheus source: per-pod GPU use read from a Prometheus server's HTTP API.

For clusters that already scrape per-pod GPU series (gpupack's node agents, or NVIDIA's
dcgm-exporter): each ``feed`` asks ``/api/v1/query_range`` for the duty cycle and memory of
every pod since its previous read, one point per the recommender's sample interval, and hands
the live pods' samples to the recommender (``controller.state.prometheus_usage`` says which
series, and the rules for bad values). The first read goes ``lookback_s`` back.

A read that fails (Prometheus unreachable, an HTTP error, an answer that is not a range query's
JSON) changes nothing: the recommender keeps its histories, the next read retries the same
times (as far back as ``lookback_s``), and the failure is logged once per kind, with a line
when reads work again. It never raises into the controller.

It meets ``controller.usage_source.UsageSource`` structurally (``source``, ``feed``).
"""

from __future__ import annotations

import http.client
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any, Literal

from controller.state.prometheus_usage import (
    Matrix,
    PrometheusAnswerError,
    QueryRange,
    ReadCounts,
    parse_matrix,
    range_to_read,
    samples_of,
    usage_queries,
)
from sharing.api.crd import RecommendationSource
from sharing.usage.recommender import Recommender

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

    def __init__(self, url: str, *, selector: str = "", lookback_s: float = 86400.0, timeout_s: float = 10.0) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"the Prometheus URL must be http(s)://host[:port][/path], got {url!r}")
        if lookback_s < 0 or timeout_s <= 0:
            raise ValueError(f"lookback must not be negative and the timeout positive, got {lookback_s}, {timeout_s}")
        self.url = url.rstrip("/")
        self.lookback_s = lookback_s
        self.timeout_s = timeout_s
        self.duty_query, self.memory_query = usage_queries(selector)
        self.next_s: float | None = None
        """Where the next read starts (None: not read yet)."""
        self.last_counts = ReadCounts()
        """What the last successful read held (``ReadCounts``)."""
        self._failing: FailureKind | None = None

    def feed(self, recommender: Recommender, pods: Mapping[str, Mapping[str, Any]], now_s: float) -> None:
        """Bring the recommender's histories up to ``now_s`` (Unix s) from Prometheus; ``pods``: the live
        pod objects by ``namespace/name``. Never raises for Prometheus's faults (module docstring)."""
        window = range_to_read(self.next_s, now_s, recommender.settings.sample_interval_s, self.lookback_s)
        if window is None:
            return
        try:
            duty = self._query(self.duty_query, window)
            memory = self._query(self.memory_query, window)
        except _ReadFailed as failed:
            if self._failing != failed.kind:
                log.warning("usage from Prometheus: %s; recommendations keep their history and the read is "
                            "retried", failed)
            self._failing = failed.kind
            return
        if self._failing is not None:
            log.info("usage from Prometheus: %s answers again", self.url)
            self._failing = None
        samples, self.last_counts = samples_of(duty, memory, pods)
        for s in samples:
            recommender.observe(s.key, s.time_s, s.duty_percent, s.memory_bytes)
        self.next_s = window.next_start
        log.debug("usage from Prometheus: %s", self.last_counts)

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


def _error_of(body: bytes) -> str:
    try:
        parse_matrix(json.loads(body))
    except PrometheusAnswerError as exc:
        return f": {exc}"
    except ValueError:
        pass
    return ""


__all__ = ["PrometheusUsageSource", "QUERY_RANGE_PATH"]
