"""The Prometheus usage source's pure part: queries, the range to read, answers parsed, samples of live pods."""

from __future__ import annotations

import math
from typing import Any

import pytest

from controller.state.prometheus_usage import (
    MAX_POINTS,
    Hit,
    PrometheusAnswerError,
    compute_unattributed_query,
    hits_of,
    limit_queries,
    parse_matrix,
    range_to_read,
    samples_of,
    usage_queries,
)
from sharing.usage.recommender import MIB, WorkloadKey
from sharing.usage.trace import MAX_MEMORY_BYTES


def answer(*series: tuple[dict[str, str], list[list[Any]]]) -> dict[str, Any]:
    """A range query's JSON answer, as Prometheus writes it."""
    return {"status": "success", "data": {"resultType": "matrix",
                                          "result": [{"metric": m, "values": v} for m, v in series]}}


def labels(pod: str, container: str = "c", namespace: str = "ml") -> dict[str, str]:
    return {"namespace": namespace, "pod": pod, "container": container}


def pod(name: str, owner: tuple[str, str] | None = None, template_hash: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "ml", "name": name, "labels": {}}
    if owner is not None:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    if template_hash:
        meta["labels"]["pod-template-hash"] = template_hash
    return {"metadata": meta}


def test_queries_read_the_agents_and_dcgm_exporters_names_per_pod() -> None:
    duty, memory = usage_queries()
    assert duty == ('max by (namespace, pod, container) (DCGM_FI_DEV_GPU_UTIL{pod!=""}) or '
                    'max by (namespace, pod, container) (DCGM_FI_PROF_GR_ENGINE_ACTIVE{pod!=""}) * 100')
    # A device's memory the agent marks as not the pod's own is left out; dcgm-exporter has no such series.
    assert memory == ('max by (namespace, pod, container) (DCGM_FI_DEV_FB_USED{pod!=""} unless on (namespace, '
                      'pod, container, UUID, GPU_I_ID) (gpupack_pod_gpu_memory_attributed{pod!=""} == 0))')
    duty, memory = usage_queries(' job="gpupack-node-agent", ')
    assert 'DCGM_FI_DEV_FB_USED{pod!="",job="gpupack-node-agent"}' in memory
    assert duty.count('job="gpupack-node-agent"') == 2 and memory.count('job="gpupack-node-agent"') == 2


def test_the_compute_unattributed_query_reads_the_agents_mark() -> None:
    assert compute_unattributed_query('job="a"') == (
        'max by (namespace, pod, container) (gpupack_pod_gpu_use_attributed{pod!="",job="a"} == 0)')


def test_limit_queries_read_the_agents_hit_counter_and_limit_raw() -> None:
    hits, limit = limit_queries('job="a"')
    assert hits == 'max by (namespace, pod, container) (gpupack_pod_gpu_memory_limit_hits_total{pod!="",job="a"})'
    assert limit == 'max by (namespace, pod, container) (gpupack_pod_gpu_memory_limit_bytes{pod!="",job="a"})'


@pytest.mark.parametrize(("next_s", "now_s", "expected"), [
    (None, 1000.0, (940.0, 1000.0, 1020.0)),  # first read: the lookback, on the step grid
    (None, 1005.0, (960.0, 1005.0, 1020.0)),  # 945 rounds up to the grid
    (1020.0, 1060.0, (1020.0, 1060.0, 1080.0)),  # from where the last one stopped
    (100.0, 1100.0, (1040.0, 1100.0, 1120.0)),  # never further back than the lookback
], ids=["first", "grid", "next", "bounded"])
def test_the_range_to_read(next_s: float | None, now_s: float, expected: tuple[float, float, float]) -> None:
    window = range_to_read(next_s, now_s, 20.0, 60.0)
    assert window is not None
    assert (window.start, window.end, window.next_start) == expected


def test_no_read_before_a_step_passed_and_never_more_points_than_prometheus_answers() -> None:
    assert range_to_read(1020.0, 1019.0, 20.0, 60.0) is None
    zero = range_to_read(None, 1005.0, 20.0, 0.0)  # no lookback still reads the latest step
    assert zero is not None and (zero.start, zero.next_start) == (1000.0, 1020.0)
    assert range_to_read(zero.next_start, 1030.0, 20.0, 0.0) == type(zero)(1020.0, 1030.0, 20.0)
    window = range_to_read(None, 1e9, 1.0, 1e7)
    assert window is not None and window.end - window.start < MAX_POINTS
    with pytest.raises(ValueError, match="step must be positive"):
        range_to_read(None, 1.0, 0.0, 60.0)


def test_an_answer_is_parsed_into_series_with_prometheus_string_values() -> None:
    matrix = parse_matrix(answer((labels("a"), [[100, "30"], [101.5, "NaN"], [102, "+Inf"], [103, 5]]),
                                 (labels("b", container=""), [])))
    assert set(matrix) == {("ml", "a", "c"), ("ml", "b", "")}
    values = matrix[("ml", "a", "c")]
    assert values[100.0] == 30.0 and all(math.isnan(values[t]) for t in (101.5, 103.0)) and values[102] == math.inf


@pytest.mark.parametrize(("body", "message"), [
    ([], "expected a JSON object, got list"),
    ({"status": "error", "errorType": "bad_data", "error": "parse error at char 3"},
     "Prometheus answered bad_data: parse error at char 3"),
    ({"status": "pending"}, "expected status 'success', got 'pending'"),
    ({"status": "success", "data": {"resultType": "vector", "result": []}}, "expected data.resultType 'matrix'"),
    ({"status": "success", "data": {"resultType": "matrix", "result": {}}}, "data.result to be a list, got dict"),
    ({"status": "success", "data": {"resultType": "matrix", "result": [1]}}, r"data.result\[0\]: expected an object"),
    (answer(({"namespace": "ml"}, [])), r"data.result\[0\]: a pod's series needs string labels namespace and pod"),
    (answer((labels("a"), [[1, "2", 3]])), r"data.result\[0\].values\[0\]: expected \[time, \"value\"\]"),
    (answer((labels("a"), [["1", "2"]])), r"values\[0\]: expected"),
    (answer((labels("a"), [[float("nan"), "2"]])), r"values\[0\]: expected"),
], ids=["not-object", "error-status", "status", "vector", "result-dict", "series-not-object", "no-pod-label",
        "point-shape", "time-string", "time-nan"])
def test_a_malformed_answer_says_what_is_wrong(body: Any, message: str) -> None:
    with pytest.raises(PrometheusAnswerError, match=message):
        parse_matrix(body)


def test_samples_go_to_each_live_pods_workload_and_container() -> None:
    duty = parse_matrix(answer((labels("web-7d9f-x1"), [[10, "40"], [20, "60"]]),
                               (labels("solo"), [[10, "5"]]),
                               (labels("gone"), [[10, "50"]])))
    memory = parse_matrix(answer((labels("web-7d9f-x1"), [[10, "1024"], [20, "2048"]]),
                                 (labels("solo"), [[10, "512"]]),
                                 (labels("gone"), [[10, "1"]])))
    pods = {"ml/web-7d9f-x1": pod("web-7d9f-x1", ("ReplicaSet", "web-7d9f"), "7d9f"), "ml/solo": pod("solo")}
    samples, counts = samples_of(duty, memory, pods)
    web = WorkloadKey("ml", "Deployment", "web", "c")
    assert [(s.key, s.time_s, s.duty_percent, s.memory_bytes) for s in samples] == [
        (WorkloadKey("ml", "Pod", "solo", "c"), 10.0, 5.0, 512 * MIB),
        (web, 10.0, 40.0, 1024 * MIB), (web, 20.0, 60.0, 2048 * MIB)]
    assert (counts.series, counts.samples, counts.skipped_series, dict(counts.dropped)) == (3, 3, 1, {})


def test_bad_values_are_dropped_with_their_pair_and_counted() -> None:
    times = [[t, "10"] for t in range(1, 7)]
    duty = parse_matrix(answer((labels("a"), [[1, "NaN"], [2, "-1"], [3, "100.5"], [4, "10"], [5, "10"]])))
    memory = parse_matrix(answer((labels("a"), [*times[:3], [4, "-5"], [5, str(MAX_MEMORY_BYTES / MIB + 1)],
                                                [6, "10"]])))
    marked = parse_matrix(answer((labels("a"), [[t, "0"] for t in range(1, 7)])))
    samples, counts = samples_of(duty, memory, {"ml/a": pod("a")}, marked)
    # A dropped duty cycle does not make its memory a memory-only sample; a marked time without a duty point does.
    assert [(s.time_s, s.duty_percent) for s in samples] == [(6.0, None)]
    assert dict(counts.dropped) == {"nan": 1, "negative": 2, "absurd": 2, "unpaired": 5}


def test_memory_without_a_duty_cycle_where_the_agent_marks_the_compute_is_a_memory_only_sample() -> None:
    """An MPS client: the agent exports its memory (attributed), no duty cycle, and use_attributed 0."""
    duty = parse_matrix(answer((labels("a"), [[1, "20"]])))
    memory = parse_matrix(answer((labels("a"), [[1, "100"], [2, "300"], [3, "200"]])))
    marked = parse_matrix(answer((labels("a"), [[2, "0"]])))
    samples, counts = samples_of(duty, memory, {"ml/a": pod("a")}, marked)
    key = WorkloadKey("ml", "Pod", "a", "c")
    # 3 s: memory without duty and without the mark (a scrape between two series' updates): nothing.
    assert [(s.key, s.time_s, s.duty_percent, s.memory_bytes) for s in samples] == [
        (key, 1.0, 20.0, 100 * MIB), (key, 2.0, None, 300 * MIB)]
    assert (counts.samples, counts.memory_only, dict(counts.dropped)) == (2, 1, {"unpaired": 1})
    samples, counts = samples_of(parse_matrix(answer((labels("a"), [[3, "20"]]))), {}, {"ml/a": pod("a")})
    assert samples == [] and counts.dropped == {"unpaired": 1}  # a duty cycle without memory is nothing


def born(name: str, uid: str, created: str) -> dict[str, Any]:
    out = pod(name)
    out["metadata"].update(uid=uid, creationTimestamp=created)
    return out


OLD = born("a", "u1", "1970-01-01T00:00:00Z")
"""A pod created long before any read."""


def test_each_rise_of_the_hit_counter_is_one_hit_at_its_time_with_the_limit_then() -> None:
    counters = parse_matrix(answer((labels("a"), [[100, "2"], [160, "2"], [220, "4"], [280, "5"]])))
    limits = parse_matrix(answer((labels("a"), [[100, str(8 * 2**30)], [220, str(8 * 2**30)],
                                                [280, str(16 * 2**30)]])))
    hits, last, dropped = hits_of(counters, limits, {"ml/a": OLD}, {}, read_from_s=100.0)
    key = WorkloadKey("ml", "Pod", "a", "c")
    # The first value is what was counted before the read (the pod is older than it): no hit.
    assert hits == [Hit(key, 220.0, 8 * 2**30, "ml/a", "u1"), Hit(key, 220.0, 8 * 2**30, "ml/a", "u1"),
                    Hit(key, 280.0, 16 * 2**30, "ml/a", "u1")]
    assert last == {("ml/a", "u1", "c"): 5.0} and dropped == {}
    # The next read goes on from the last value: the same count again is no hit.
    again = parse_matrix(answer((labels("a"), [[340, "5"], [400, "6"]])))
    hits, last, _ = hits_of(again, limits, {"ml/a": OLD}, last, read_from_s=100.0)
    assert [(h.time_s, h.limit_bytes) for h in hits] == [(400.0, 16 * 2**30)] and last[("ml/a", "u1", "c")] == 6.0


def test_a_counter_that_falls_was_reset_and_its_new_count_is_all_new_hits() -> None:
    """The agent restarted: its counter starts again from 0 (node.metrics)."""
    counters = parse_matrix(answer((labels("a"), [[100, "3"], [160, "3"], [220, "1"], [280, "1"]])))
    limits = parse_matrix(answer((labels("a"), [[100, "1000"]])))
    hits, last, _ = hits_of(counters, limits, {"ml/a": OLD}, {("ml/a", "u1", "c"): 3.0}, read_from_s=0.0)
    assert [(h.time_s, h.limit_bytes) for h in hits] == [(220.0, 1000)] and last[("ml/a", "u1", "c")] == 1.0


def test_a_pod_created_within_what_was_read_counts_from_zero_and_only_its_own_points() -> None:
    young = born("a", "u2", "1970-01-01T00:02:30Z")  # 150 s
    counters = parse_matrix(answer((labels("a"), [[100, "7"], [160, "1"], [220, "2"]])))
    limits = parse_matrix(answer((labels("a"), [[100, "5"], [160, "1000"]])))
    hits, last, _ = hits_of(counters, limits, {"ml/a": young}, {}, read_from_s=100.0)
    # 100 s is an earlier pod's of the name; the new pod's first value is its own first hit.
    assert [(h.time_s, h.limit_bytes, h.uid) for h in hits] == [(160.0, 1000, "u2"), (220.0, 1000, "u2")]
    assert last == {("ml/a", "u2", "c"): 2.0}


def test_hits_of_pods_not_live_are_skipped_and_a_hit_without_a_known_limit_is_dropped() -> None:
    counters = parse_matrix(answer((labels("a"), [[100, "0"], [160, "2"]]), (labels("gone"), [[100, "0"], [160, "1"]])))
    hits, last, dropped = hits_of(counters, {}, {"ml/a": OLD}, {}, read_from_s=0.0)
    assert hits == [] and dropped == {"hit_without_limit": 2} and set(last) == {("ml/a", "u1", "c")}
