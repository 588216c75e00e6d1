"""The pure parts of ``benchmarks/fleet_steady.py``: the seeded load, the pods it writes, the metric sums."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def bench() -> Any:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "fleet_steady.py"
    spec = importlib.util.spec_from_file_location("fleet_steady", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fleet_steady"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_load_is_seeded_bounded_and_half_mig_half_mps(bench: Any) -> None:
    plan = bench.load_plan(4000, 16, floor=False)
    assert plan == bench.load_plan(4000, 16, floor=False)
    assert plan != bench.load_plan(4000, 17, floor=False)
    assert all(30 <= p.duration_s <= 90 for p in plan)
    assert 55 <= sum(p.duration_s for p in plan) / len(plan) <= 65
    mig = [p for p in plan if p.kind == "mig"]
    assert 0.45 < len(mig) / len(plan) < 0.55
    assert {p.milli for p in mig} == {140, 280, 420}
    assert {p.milli for p in plan if p.kind == "mps"} == {250, 500}


def test_the_floor_asks_whole_gpus_with_the_same_durations(bench: Any) -> None:
    floor = bench.load_plan(100, 16, floor=True)
    assert {p.kind for p in floor} == {"whole"}
    gpupack = bench.load_plan(100, 16, floor=False)
    assert floor[0].duration_s == gpupack[0].duration_s  # the first draw of each pod is its duration


@pytest.mark.parametrize(("kind", "limits", "sharing"), [
    ("mig", {"gpupack.io/gpu-milli": "280"}, "mig"),
    ("mps", {"gpupack.io/gpu-milli": "280"}, "mps"),
    ("whole", {"nvidia.com/gpu": "1"}, None),
], ids=["mig", "mps", "floor"])
def test_a_pod_asks_what_its_kind_needs_and_carries_its_duration(
        bench: Any, kind: str, limits: dict[str, str], sharing: str | None) -> None:
    pod = bench.pod_manifest(bench.PodAsk(7, kind, 280, 45), "r1")
    assert pod["metadata"]["name"] == "p000007"
    assert pod["metadata"]["annotations"]["gpupack.io/duration-seconds"] == "45"
    assert pod["metadata"]["annotations"].get("gpupack.io/sharing") == sharing
    assert pod["spec"]["containers"][0]["resources"]["limits"] == limits


def test_percentile_is_nearest_rank(bench: Any) -> None:
    assert bench.percentile([], 0.5) is None
    assert bench.percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert bench.percentile([float(i) for i in range(1, 101)], 0.95) == 95.0


METRICS = """# HELP apiserver_request_total x
apiserver_request_total{code="201",component="apiserver",resource="pods",scope="resource",verb="POST"} 5
apiserver_request_total{code="200",component="apiserver",resource="pods",subresource="binding",verb="POST"} 1
apiserver_request_total{code="200",component="apiserver",resource="leases",verb="PUT"} 7
apiserver_request_total{code="200",component="apiserver",resource="pods",verb="LIST"} 2
gpupack_fleet_api_requests_total{by="agents",resource="gpunodes/status",verb="patch"} 12.0
gpupack_fleet_api_requests_total{by="fleet",resource="pods",verb="watch"} 3.0
"""


def test_metric_sums_and_deltas(bench: Any) -> None:
    api = bench.apiserver_by_verb_resource(METRICS)
    assert api == {"POST pods": 5, "POST pods/binding": 1, "PUT leases": 7, "LIST pods": 2}
    delta = bench.counter_delta({"POST pods": 2, "PUT leases": 7}, api)
    assert delta == {"POST pods": 3, "LIST pods": 2, "POST pods/binding": 1}
    assert bench.writes({"POST pods": 3, "LIST pods": 2, "PUT leases": 4, "PATCH x": 1}) == 8
    fleet = bench.fleet_requests(METRICS)
    assert fleet == {"agents patch gpunodes/status": 12.0, "fleet watch pods": 3.0}


def test_mig_fraction_zero_is_mps_only_with_the_same_durations(bench: Any) -> None:
    mps = bench.load_plan(500, 16, floor=False, mig_fraction=0.0)
    assert {p.kind for p in mps} == {"mps"}
    assert [p.duration_s for p in mps] == [p.duration_s for p in bench.load_plan(500, 16, floor=False)]
