"""The Prometheus usage source's I/O, against a local HTTP server that answers canned JSON: what it asks,
what it feeds, and how it survives an unreachable server, HTTP errors and malformed answers."""

from __future__ import annotations

import json
import logging
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from controller.settings import ControllerSettings
from controller.usage_prometheus import QUERY_RANGE_PATH, PrometheusUsageSource
from sharing.usage.recommender import MIB, Recommender, RecommenderSettings, WorkloadKey
from tests.unit.test_prometheus_usage import answer, labels, pod

LOGGER = "gpupack.controller.usage"


class CannedPrometheus:
    """Answers each query_range with the next (status, body) of ``answers`` (the last one repeats)."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, bytes]] = []
        self.requests: list[dict[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length", "0"))
                form = urllib.parse.parse_qs(self.rfile.read(length).decode())
                outer.requests.append({"path": self.path, **{k: v[0] for k, v in form.items()}})
                status, body = outer.answers.pop(0) if len(outer.answers) > 1 else outer.answers[0]
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer_json(self, *bodies: Any, status: int = 200) -> None:
        self.answers = [(status, json.dumps(b).encode()) for b in bodies]


@pytest.fixture
def prometheus() -> Iterator[CannedPrometheus]:
    canned = CannedPrometheus()
    yield canned
    canned.server.shutdown()
    canned.server.server_close()


def recommender() -> Recommender:
    return Recommender(RecommenderSettings(sample_interval_s=10.0))


DUTY = answer((labels("a"), [[100, "20"], [110, "80"]]), (labels("other"), [[100, "1"]]))
MEMORY = answer((labels("a"), [[100, "1000"], [110, "3000"]]), (labels("other"), [[100, "1"]]))
HITS = answer((labels("a"), [[100, "0"], [110, "1"]]))
LIMITS = answer((labels("a"), [[100, str(4000 * MIB)]]))
PODS = {"ml/a": pod("a")}


def test_it_asks_query_range_since_its_last_read_and_feeds_the_live_pods(prometheus: CannedPrometheus) -> None:
    prometheus.answer_json(DUTY, MEMORY, answer(), HITS, LIMITS, answer())
    source = PrometheusUsageSource(prometheus.url + "/", selector='job="agents"', lookback_s=20.0)
    rec = recommender()
    source.feed(rec, PODS, 115.0)
    first, second, unattributed, hits, limits = prometheus.requests
    assert {r["path"] for r in prometheus.requests} == {QUERY_RANGE_PATH}
    assert (float(first["start"]), float(first["end"]), float(first["step"])) == (100.0, 115.0, 10.0)
    assert "DCGM_FI_DEV_GPU_UTIL" in first["query"] and 'job="agents"' in first["query"]
    assert "DCGM_FI_DEV_FB_USED" in second["query"] and "gpupack_pod_gpu_use_attributed" in unattributed["query"]
    assert "gpupack_pod_gpu_memory_limit_hits_total" in hits["query"] and 'job="agents"' in hits["query"]
    assert "gpupack_pod_gpu_memory_limit_bytes" in limits["query"]
    history = rec.histories[WorkloadKey("ml", "Pod", "a", "c")]
    # The counter's rise at 110 s is one hit: the memory raised as Recommender.record_oom raises it.
    expected = Recommender(rec.settings)
    expected.record_oom(WorkloadKey("ml", "Pod", "a", "c"), 110.0, 4000 * MIB)
    bumped = expected.histories[WorkloadKey("ml", "Pod", "a", "c")]
    assert (history.samples, history.ooms, source.last_counts.hits) == (2, 1, 1)
    assert max(history.memory.peak(), history.oom_floor.peak()) == max(bumped.memory.peak(),
                                                                      bumped.oom_floor.peak()) > 4000 * MIB
    assert list(rec.histories) == [WorkloadKey("ml", "Pod", "a", "c")]  # "other" is no live pod
    assert source.last_counts.skipped_series == 1
    source.feed(rec, PODS, 131.0)
    assert float(prometheus.requests[5]["start"]) == 120.0  # no time read twice
    assert rec.histories[WorkloadKey("ml", "Pod", "a", "c")].ooms == 1  # a hit is counted once
    source.feed(rec, PODS, 135.0)
    assert len(prometheus.requests) == 10  # no step since: nothing asked


@pytest.mark.parametrize(("status", "body", "logged"), [
    (503, json.dumps({"status": "error", "errorType": "unavailable", "error": "TSDB not ready"}).encode(),
     "answered HTTP 503: Prometheus answered unavailable: TSDB not ready"),
    (400, b"<html>bad</html>", "answered HTTP 400"),
    (200, b"{not json", "answered not JSON"),
    (200, json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode(),
     "expected data.resultType 'matrix'"),
], ids=["503", "400-html", "not-json", "vector"])
def test_a_failed_read_feeds_nothing_logs_once_and_is_retried(
        prometheus: CannedPrometheus, caplog: pytest.LogCaptureFixture, status: int, body: bytes, logged: str) -> None:
    prometheus.answers = [(status, body)]
    source = PrometheusUsageSource(prometheus.url, lookback_s=20.0)
    rec = recommender()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for now in (115.0, 125.0, 135.0):
            source.feed(rec, PODS, now)
        assert rec.histories == {} and source.next_s is None
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and logged in warnings[0], warnings
        prometheus.answer_json(DUTY, MEMORY)
        source.feed(rec, PODS, 115.0)
    assert rec.histories[WorkloadKey("ml", "Pod", "a", "c")].samples == 2
    assert any("answers again" in r.getMessage() for r in caplog.records)


def test_an_unreachable_prometheus_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    source = PrometheusUsageSource(f"http://127.0.0.1:{port}", timeout_s=2.0)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for now in (100.0, 200.0):
            source.feed(recommender(), PODS, now)
    assert [r.getMessage() for r in caplog.records] == [
        f"usage from Prometheus: cannot reach http://127.0.0.1:{port} ([Errno 111] Connection refused); "
        "recommendations keep their history and the read is retried"]


@pytest.mark.parametrize("url", ["", "prometheus:9090", "ftp://p", "http://"])
def test_a_bad_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="must be http"):
        PrometheusUsageSource(url)


def test_the_settings_ask_for_a_url_with_the_prometheus_source() -> None:
    assert ControllerSettings.from_env({}).usage_source == "agents"
    settings = ControllerSettings.from_env({"GPUPACK_CONTROLLER_USAGE_SOURCE": "prometheus",
                                            "GPUPACK_CONTROLLER_PROMETHEUS_URL": "http://p:9090",
                                            "GPUPACK_CONTROLLER_PROMETHEUS_LOOKBACK_SECONDS": "3600"})
    assert (settings.prometheus_url, settings.prometheus_lookback_seconds) == ("http://p:9090", 3600.0)
    with pytest.raises(ValueError, match="needs prometheus_url"):
        ControllerSettings.from_env({}, usage_source="prometheus")
    with pytest.raises(ValueError, match="usage_source must be one of agents, prometheus"):
        ControllerSettings.from_env({}, usage_source="dcgm")
