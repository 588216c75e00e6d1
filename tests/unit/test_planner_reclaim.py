"""Reclaiming a shared node for a whole-GPU pod of higher priority (issue 36): the engine's reshape live.

A pod asking ``nvidia.com/gpu`` itself that kube-scheduler left Unschedulable (its own preemption found
nothing), or one of gpupack's gated whole-GPU pods, gets the engine's plan over shared nodes whose
policy gate is open: every GPU pod of a node whose pods are all of lower priority is preempted, the
node is held for the preemptor, and switched back to whole GPUs once the victims are gone.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from controller.planning.planner import Plan, SharingChange, in_flight, plan
from controller.planning.preemption import Preemption, Victim
from controller.reconcile import Controller, CycleReport
from controller.settings import ControllerSettings
from controller.state.build import parse_pod
from controller.state.pods import plain_preemptor
from controller.state.snapshot import Gpu, Node, PlainGpuPod, Pod, Snapshot
from controller.writes.preemption import plain_preemptor_ops, preemptor_ops
from gpupack.replay.outcome import classify
from mig.catalog import get_model
from sharing.api.keys import PREEMPTING_ANNOTATION
from sharing.api.preempting import PreemptingRecord, preempting_text, read_preempting
from sharing.api.priority import NEVER, PREEMPT_LOWER_PRIORITY, PodPriority
from sharing.rules.node_policy import NodePolicy
from tests.unit.test_controller_preemption import RecordingKube

H100 = get_model("H100-80GB")
NOW = datetime(2026, 11, 30, 2, 0, tzinfo=timezone.utc)
POLICY = NodePolicy(names=("p",), max_concurrent=2, idle_seconds=600)
HIGH, LOW = 1000, 0


def mps_node(name: str, *, idle: bool = False, gpus: int = 1, replicas: int = 2) -> Node:
    """A node sharing its GPUs by MPS; ``idle``: its GPUs reported unused for a second only (never
    idle long enough for ``POLICY``'s 600 s)."""
    since = NOW - timedelta(seconds=1) if idle else None
    return Node(name, H100.product, H100, (("pool", "a"),), "mps", replicas,
                tuple(Gpu(i, H100.memory_mib, False, idle_since=since) for i in range(gpus)),
                spec_sharing="mps", spec_replicas=replicas)


def whole_node(name: str) -> Node:
    return Node(name, H100.product, H100, (("pool", "a"),), "none", 1, (Gpu(0, H100.memory_mib, False),),
                whole_taken=1)


def replica(name: str, priority: int, on: str | None, milli: int = 400) -> Pod:
    """A gpupack MPS pod of one replica, bound to ``on`` (None: gated, waiting)."""
    return Pod("team", name, "mps", NOW - timedelta(minutes=10), milli=(milli,), memory_bytes=(None,),
               gated=on is None, node=on, bound=on is not None, uid=f"uid-{name}", priority=PodPriority(priority))


def plain(name: str, priority: int = HIGH, *, policy: str = PREEMPT_LOWER_PRIORITY, node: str | None = None,
          victims: tuple[str, ...] = ()) -> PlainGpuPod:
    """A pod asking one ``nvidia.com/gpu`` itself, Unschedulable; ``node``/``victims``: its record."""
    view = Pod("ml", name, "whole", NOW - timedelta(minutes=1), milli=(1000,), memory_bytes=(None,),
               unschedulable=True, node=node, uid=f"uid-{name}", priority=PodPriority(priority, policy),
               victims=victims, plain=True)
    return PlainGpuPod(f"ml/{name}", 1, priority=priority, preemptor=view)


def run(nodes: list[Node], pods: list[Pod], waiting: list[PlainGpuPod], *,
        policies: dict[str, NodePolicy] | None = None, present: frozenset[str] | None = None) -> Plan:
    uids = frozenset(p.uid for p in pods) if present is None else present
    return plan(Snapshot(tuple(nodes), tuple(pods), {n.name: POLICY for n in nodes} if policies is None else policies,
                         whole_waiting=sum(p.gpus for p in waiting), plain_gpu_pods=tuple(waiting), present=uids), NOW)


BE_NODE = [replica("be1", LOW, "a"), replica("be2", LOW, "a")]


# ------------------------------------------------------------------ the preemption
def test_a_plain_high_pod_reclaims_a_node_of_best_effort_replicas() -> None:
    """No free or incoming whole GPU, no idle shared node: both replicas of node a go, reason reshape,
    and a best-effort pod waiting for a replica gets nothing there meanwhile."""
    result = run([mps_node("a"), whole_node("w")], [*BE_NODE, replica("late", LOW, None)], [plain("llm")])
    (preemption,) = result.preemptions
    assert (preemption.preemptor, preemption.node, preemption.kind) == ("ml/llm", "a", "reshape")
    assert preemption.plain and not preemption.resumed
    assert sorted(v.key for v in preemption.victims) == ["team/be1", "team/be2"]
    assert result.sharing == () and result.releases == ()
    assert [w.pod for w in result.waiting] == ["team/late"]  # a plain pod gets no placement status


def test_once_the_victims_are_gone_the_node_is_switched_back_and_held() -> None:
    """Victims gone, GPU reported unused for a second (the policy's 600 s idle time not asked): the
    node returns to whole GPUs for the preemptor, and the waiting best-effort pod does not get the
    node's now free replicas."""
    waiting = [plain("llm", node="a", victims=("uid-be1", "uid-be2"))]
    result = run([mps_node("a", idle=True)], [replica("late", LOW, None)], waiting)
    assert result.sharing == (SharingChange("a", "none", 1, "reclaimed for ml/llm, which needs 1 whole GPU(s)"),)
    assert result.releases == () and result.preemptions == ()
    (late,) = result.waiting
    assert late.pod == "team/late" and not late.coming


def test_while_a_victim_terminates_the_node_is_held_and_nothing_is_preempted_again() -> None:
    waiting = [plain("llm", node="a", victims=("uid-be1", "uid-be2"))]
    result = run([mps_node("a", idle=True)], [replica("late", LOW, None)], waiting,
                 present=frozenset({"uid-be1", "uid-late"}))
    assert result.preemptions == () and result.sharing == () and result.releases == ()


def test_not_switched_while_the_agent_reports_the_gpu_in_use() -> None:
    waiting = [plain("llm", node="a", victims=("uid-be1",))]
    result = run([mps_node("a")], [], waiting)
    assert result.sharing == () and result.preemptions == ()


def test_a_held_node_holds_its_policy_slot_from_the_preemption_on() -> None:
    waiting = [plain("llm", node="a", victims=("uid-be1",))]
    snapshot = Snapshot((mps_node("a"),), (), {"a": POLICY}, plain_gpu_pods=tuple(waiting))
    assert in_flight(snapshot)[("p",)] == 1
    assert in_flight(replace(snapshot, plain_gpu_pods=()))[("p",)] == 0


def test_a_gated_whole_pod_reclaims_too() -> None:
    own = Pod("team", "train", "whole", NOW, milli=(1000,), memory_bytes=(None,), gated=True, uid="uid-train",
              priority=PodPriority(HIGH))
    (preemption,) = run([mps_node("a"), whole_node("w")], [*BE_NODE, own], []).preemptions
    assert (preemption.node, preemption.kind, preemption.plain) == ("a", "reshape", False)
    pinned = replace(own, node="a", victims=("uid-be1", "uid-be2"))
    result = run([mps_node("a", idle=True)], [pinned, replica("late", LOW, None)], [])
    assert [(c.node, c.mode) for c in result.sharing] == [("a", "none")]
    assert result.releases == ()


# ------------------------------------------------------------------ when not
@pytest.mark.parametrize(("preemptor", "pods", "why"), [
    (plain("same", LOW), BE_NODE, "equal priority never preempts"),
    (plain("never", HIGH, policy=NEVER), BE_NODE, "preemptionPolicy Never"),
    (plain("llm"), [replica("be1", LOW, "a"), replica("peer", HIGH, "a")], "a pod of equal priority on the node"),
    (plain("llm"), [replica("be1", LOW, "a"), replica("top", HIGH + 1, "a")], "a pod of higher priority on the node"),
], ids=["equal", "never", "peer-on-node", "higher-on-node"])
def test_no_reclaim(preemptor: PlainGpuPod, pods: list[Pod], why: str) -> None:
    assert run([mps_node("a"), whole_node("w")], pods, [preemptor]).preemptions == (), why


def test_no_reclaim_where_the_gate_is_shut() -> None:
    """maxConcurrent 1 with another switch of the policy under way, or no policy at all: node a is not
    reclaimed, so no pod waits on GPUs that may not return to whole-GPU use."""
    one = NodePolicy(names=("p",), max_concurrent=1, idle_seconds=0)
    moving = replace(mps_node("b"), spec_sharing="time-slicing")
    assert run([mps_node("a"), moving], BE_NODE, [plain("llm")], policies={"a": one, "b": one}).preemptions == ()
    assert run([mps_node("a")], BE_NODE, [plain("llm")], policies={}).preemptions == ()


def test_a_pod_kube_scheduler_preempts_for_itself_is_left_to_it() -> None:
    obj = pod_object(nominated="w")
    assert plain_preemptor(obj, 1) is None
    assert parse_pod(obj).plain is not None and parse_pod(obj).plain.preemptor is None  # type: ignore[union-attr]


# ------------------------------------------------------------------ the record
def pod_object(*, nominated: str | None = None, record: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "llm", "namespace": "ml", "uid": "u1", "resourceVersion": "7",
                            "creationTimestamp": "2026-11-30T01:59:00Z"}
    if record is not None:
        meta["annotations"] = {PREEMPTING_ANNOTATION: record}
    status: dict[str, Any] = {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
    if nominated:
        status["nominatedNodeName"] = nominated
    return {"metadata": meta, "status": status, "spec": {
        "priority": HIGH, "preemptionPolicy": PREEMPT_LOWER_PRIORITY,
        "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "2"}}}]}}


def test_the_record_reads_back_and_the_view_follows_it() -> None:
    text = preempting_text(PreemptingRecord(("uid-1", "uid-2"), "node-7"))
    assert text == "uid-1,uid-2@node-7"
    assert read_preempting({PREEMPTING_ANNOTATION: text}) == PreemptingRecord(("uid-1", "uid-2"), "node-7")
    assert read_preempting({PREEMPTING_ANNOTATION: "uid-1, ,uid-2,"}) == PreemptingRecord(("uid-1", "uid-2"))
    assert read_preempting({}) is None
    with pytest.raises(ValueError, match="cannot be recorded"):
        preempting_text(PreemptingRecord(("u",), "bad@name"))
    view = plain_preemptor(pod_object(nominated="node-7", record=text), 1)
    assert view is not None and view.plain and view.mode == "whole" and not view.gated
    assert (view.node, view.victims, view.cpu_milli, view.priority.value) == ("node-7", ("uid-1", "uid-2"), 2000, HIGH)


def test_what_the_controller_writes_for_a_plain_preemptor() -> None:
    obj = pod_object()
    ops = plain_preemptor_ops(obj, "a", ["uid-1", "uid-2"])
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    assert ops[-1]["value"] == "uid-1,uid-2@a" and ops[1] == {"op": "add", "path": "/metadata/annotations", "value": {}}
    with pytest.raises(ValueError, match="resourceVersion"):
        plain_preemptor_ops({"metadata": {}}, "a", ["uid-1"])
    with pytest.raises(ValueError):
        preemptor_ops(obj, "a", ["uid-1"], pinned=False)  # not gated by gpupack: never pinned


def test_the_replay_waits_for_a_pod_gpupack_preempts_for() -> None:
    assert classify(pod_object()) == ("unplaceable", "scheduler")
    assert classify(pod_object(record="uid-1@a")) == ("waiting", None)


# ------------------------------------------------------------------ a fractional preemptor
def shared_preemptor(milli: int, **pinned: Any) -> Pod:
    return Pod("team", "infer", "mps", NOW, milli=(milli,), memory_bytes=(None,), gated=True, uid="uid-infer",
               priority=PodPriority(HIGH), **pinned)


def test_a_pod_too_big_for_a_split_reclaims_the_node_and_it_is_split_at_its_size() -> None:
    """400 milli fits no replica of a split into four: the four best-effort replicas go, and once they
    are gone the node is split anew into two replicas for it (its own size under the policy)."""
    fours = [replica(f"q{i}", LOW, "a", milli=200) for i in range(4)]
    (preemption,) = run([mps_node("a", replicas=4)], [*fours, shared_preemptor(400)], []).preemptions
    assert (preemption.node, preemption.kind, len(preemption.victims)) == ("a", "reshape", 4)
    pinned = shared_preemptor(400, node="a", victims=tuple(p.uid for p in fours))
    result = run([mps_node("a", idle=True, replicas=4)], [pinned, replica("late", LOW, None, milli=200)], [])
    assert [(c.node, c.mode, c.replicas) for c in result.sharing] == [("a", "mps", 2)]
    assert result.releases == ()


def test_a_whole_gpu_node_of_best_effort_pods_is_reclaimed_for_a_replica() -> None:
    """No shared node: the unshared node whose GPU holds a best-effort whole-GPU pod of gpupack's is
    reclaimed and split by MPS at the pod's own size (two replicas of 400 milli)."""
    holder = Pod("team", "be-whole", "whole", NOW, milli=(1000,), memory_bytes=(None,), node="w", bound=True,
                 uid="uid-be-whole", priority=PodPriority(LOW))
    (preemption,) = run([whole_node("w")], [holder, shared_preemptor(400)], []).preemptions
    assert (preemption.node, preemption.kind, [v.key for v in preemption.victims]) == ("w", "reshape", ["team/be-whole"])
    idle = replace(whole_node("w"), whole_taken=0,
                   gpus=(Gpu(0, H100.memory_mib, False, idle_since=NOW - timedelta(seconds=1)),))
    result = run([idle], [shared_preemptor(400, node="w", victims=("uid-be-whole",))], [])
    assert [(c.node, c.mode, c.replicas) for c in result.sharing] == [("w", "mps", 2)]


# ------------------------------------------------------------------ the writes, through the controller
def test_the_controller_records_a_plain_preemptor_then_preempts_and_skips_quietly_when_it_changed() -> None:
    reshape = Preemption("ml/llm", "a", (Victim("team/be1", "uid-be1", 0, 400),), "test", "reshape", plain=True)
    kube = RecordingKube()
    controller = Controller(kube, ControllerSettings(), clock=lambda: NOW)  # type: ignore[arg-type]
    report = CycleReport()
    controller._preempt([reshape], {"ml/llm": pod_object()}, NOW, report)  # noqa: SLF001
    assert [(c[0], c[1]) for c in kube.calls] == [("pin", "ml/llm"), ("status", "team/be1"), ("event", "team/be1"),
                                                  ("delete", "team/be1")]
    assert kube.calls[0][2][-1]["value"] == "uid-be1@a" and report.errors == []
    assert controller.metrics.registry.get_sample_value("gpupack_preemptions_total", {"reason": "reshape"}) == 1
    changed = RecordingKube(fail_pin=True)  # the resourceVersion test failed: nothing deleted, no error
    controller = Controller(changed, ControllerSettings(), clock=lambda: NOW)  # type: ignore[arg-type]
    report = CycleReport()
    controller._preempt([reshape], {"ml/llm": pod_object()}, NOW, report)  # noqa: SLF001
    assert changed.calls == [] and report.errors == [] and report.preempted == []
