"""Taints and tolerations: kube-scheduler's filter rule, its readers, the planner pinning only where a
pod tolerates the node, and the controller's node cache keeping taints."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from controller.planning.planner import plan
from controller.state.pods import plain_preemptor
from controller.state.snapshot import Gpu, Node, Pod, Snapshot
from controller.watch_caches import keep_node
from mig.catalog import get_model
from sharing.rules.node_policy import NodePolicy
from sharing.rules.taints import Taint, Toleration, read_taints, read_tolerations, tolerates
from tests.unit.test_planner_reclaim import pod_object

H100 = get_model("H100-80GB")
NOW = datetime(2026, 12, 5, 2, 0, tzinfo=timezone.utc)
GPU_TAINT = Taint("nvidia.com/gpu", "present", "NoSchedule")


@pytest.mark.parametrize(("toleration", "taint", "expected"), [
    (Toleration("nvidia.com/gpu", "Exists"), GPU_TAINT, True),
    (Toleration("", "Exists"), GPU_TAINT, True),  # an empty key with Exists tolerates every taint
    (Toleration("nvidia.com/gpu", "Equal", "present"), GPU_TAINT, True),
    (Toleration("nvidia.com/gpu", "Equal", "absent"), GPU_TAINT, False),
    (Toleration("nvidia.com/gpu", "Exists", effect="NoExecute"), GPU_TAINT, False),  # another effect
    (Toleration("nvidia.com/gpu", "Exists", effect="NoSchedule"), GPU_TAINT, True),
    (Toleration("other", "Exists"), GPU_TAINT, False),
], ids=["exists", "exists-any-key", "equal", "equal-other-value", "other-effect", "same-effect", "other-key"])
def test_a_toleration_matches_a_taint_as_kube_scheduler_reads_it(toleration: Toleration, taint: Taint,
                                                                 expected: bool) -> None:
    assert toleration.matches(taint) is expected
    assert tolerates([toleration], [taint]) is expected


def test_every_filtering_taint_must_be_tolerated_and_prefer_no_schedule_never_filters() -> None:
    other = Taint("team", "a", "NoExecute")
    assert tolerates([], []) is True
    assert tolerates([Toleration("nvidia.com/gpu", "Exists")], [GPU_TAINT, other]) is False
    assert tolerates([Toleration("nvidia.com/gpu", "Exists"), Toleration("team", "Equal", "a")], [GPU_TAINT, other])
    assert tolerates([], [Taint("soft", "", "PreferNoSchedule")]) is True


def test_the_readers_keep_what_the_api_server_would_accept() -> None:
    spec = {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                       {"key": "soft", "effect": "PreferNoSchedule"}, "junk", {"effect": "NoSchedule"},
                       {"key": "gone", "effect": "NoExecute"}]}
    assert read_taints(spec) == (Taint("gone", "", "NoExecute"), GPU_TAINT)
    assert read_taints({}) == () and read_taints({"taints": "x"}) == ()
    pod_spec = {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}, {"operator": "Sometimes"},
                                {"key": 5}, {"key": "team", "value": "a", "effect": "NoExecute"}]}
    assert read_tolerations(pod_spec) == (Toleration("nvidia.com/gpu", "Exists"),
                                          Toleration("team", "Equal", "a", "NoExecute"))


def _whole_node(name: str, taints: tuple[Taint, ...] = ()) -> Node:
    return Node(name, H100.product, H100, (("pool", "a"),), "none", 1, (Gpu(0, H100.memory_mib, False),),
                taints=taints)


def _whole_pod(tolerations: tuple[Toleration, ...] = ()) -> Pod:
    return Pod("team", "p", "whole", NOW - timedelta(minutes=1), milli=(1000,), memory_bytes=(None,), gated=True,
               uid="uid-p", tolerations=tolerations)


def test_the_planner_pins_a_pod_only_where_it_tolerates_the_taints() -> None:
    nodes = (_whole_node("a-tainted", (GPU_TAINT,)), _whole_node("b-plain"))
    policies = {n.name: NodePolicy(names=("p",)) for n in nodes}
    result = plan(Snapshot(nodes, (_whole_pod(),), policies), NOW)
    assert [(r.pod, r.node) for r in result.releases] == [("team/p", "b-plain")]
    only_tainted = plan(Snapshot(nodes[:1], (_whole_pod(),), {"a-tainted": policies["a-tainted"]}), NOW)
    assert only_tainted.releases == ()  # never pinned where it would stay Pending
    tolerant = _whole_pod((Toleration("nvidia.com/gpu", "Exists"),))
    assert [r.node for r in plan(Snapshot(nodes[:1], (tolerant,), {"a-tainted": policies["a-tainted"]}), NOW).releases] \
        == ["a-tainted"]


def test_pods_and_nodes_carry_their_tolerations_and_taints_through_the_readers() -> None:
    node: dict[str, Any] = {"metadata": {"name": "n", "labels": {"a": "b"}, "annotations": {"big": "x"}},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
                     "podCIDR": "10.0.0.0/24"},
            "status": {"allocatable": {"cpu": "8"}, "images": ["x"]}}
    kept = keep_node(node)
    assert kept["spec"] == {"taints": node["spec"]["taints"]} and "annotations" not in kept["metadata"]
    assert "spec" not in keep_node({"metadata": {"name": "m"}})
    obj = pod_object()
    obj["spec"] = {**obj["spec"], "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}
    view = plain_preemptor(obj, 1)  # kube-scheduler's pod the planner may hold a node for
    assert view is not None and view.tolerations == (Toleration("nvidia.com/gpu", "Exists"),)
