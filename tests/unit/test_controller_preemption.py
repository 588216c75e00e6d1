"""Priority in the live planner: waiting order, who may preempt whom, which victims, no second kill,
what the controller writes for a preemption, and pods with odd priority fields (issue 36, item 1)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from controller.planning.budgets import protected_pods
from controller.planning.draplan import DraPlan, plan_dra
from controller.planning.planner import Plan, plan
from controller.planning.preemption import Preemption, Victim
from controller.reconcile import Controller, CycleReport
from controller.settings import ControllerSettings
from controller.state.dra_usage import read_usage
from controller.state.pods import pod_from_object
from controller.state.snapshot import Gpu, Node, Pod, Snapshot
from controller.writes.preemption import disruption_patch, preemptor_ops
from kube.client import KubeClient
from kube.errors import KubeError
from mig.catalog import get_model
from mig.model import PlacedInstance, Placement
from sharing.api.allocation import Allocation, ContainerAllocation
from sharing.api.keys import BACKEND_LABEL
from sharing.dra import names
from sharing.dra.share_policy import GiB
from sharing.api.keys import ALLOCATION_ANNOTATION, CAPACITY_GATE, PREEMPTING_ANNOTATION, PREEMPTION_REASON
from sharing.api.priority import NEVER, PREEMPT_LOWER_PRIORITY, PodPriority
from sharing.rules.node_policy import NodePolicy

H100 = get_model("H100-80GB")
NOW = datetime(2026, 11, 30, 2, 0, tzinfo=timezone.utc)
POLICY = NodePolicy(names=("p",), max_concurrent=2, idle_seconds=600)


def mps_node(name: str, gpus: int = 1, replicas: int = 2) -> Node:
    """A node sharing its GPUs by MPS into ``replicas``, busy (no idle time: never re-split)."""
    return Node(name, H100.product, H100, (("pool", "a"),), "mps", replicas,
                tuple(Gpu(i, H100.memory_mib, False) for i in range(gpus)), spec_sharing="mps",
                spec_replicas=replicas)


def pod(name: str, priority: int = 0, *, on: str | None = None, minutes_old: int = 10, milli: int = 400,
        policy: str = PREEMPT_LOWER_PRIORITY, victims: tuple[str, ...] = ()) -> Pod:
    return Pod("team", name, "mps", NOW - timedelta(minutes=minutes_old), milli=(milli,), memory_bytes=(None,),
               gated=on is None, node=on, bound=on is not None, uid=f"uid-{name}",
               priority=PodPriority(priority, policy), victims=victims)


def run(nodes: list[Node], pods: list[Pod], present: frozenset[str] | None = None) -> Plan:
    uids = frozenset(p.uid for p in pods) if present is None else present
    return plan(Snapshot(tuple(nodes), tuple(pods), {n.name: POLICY for n in nodes}, present=uids), NOW)


# ------------------------------------------------------------------ order
def test_a_higher_priority_pod_is_placed_before_an_older_lower_one() -> None:
    """One free replica: the newer high-priority pod gets it, the older best-effort pod waits."""
    pods = [pod("held", 0, on="a"), pod("old-low", 0, minutes_old=30), pod("new-high", 100, minutes_old=1)]
    result = run([mps_node("a")], pods)
    assert [(r.pod, r.node) for r in result.releases] == [("team/new-high", "a")]
    assert [w.pod for w in result.waiting] == ["team/old-low"]


def test_equal_priority_keeps_oldest_first_then_name() -> None:
    pods = [pod("b", 5, minutes_old=10), pod("a", 5, minutes_old=10), pod("older", 5, minutes_old=20)]
    result = run([mps_node("a", replicas=2)], pods)
    assert [r.pod for r in result.releases] == ["team/older", "team/a"]


# ------------------------------------------------------------------ who preempts whom
def test_a_pod_that_fits_nowhere_preempts_the_lowest_priority_pod_only() -> None:
    pods = [pod("low", 0, on="a", milli=300), pod("mid", 50, on="a"), pod("high", 100)]
    result = run([mps_node("a")], pods)
    (preemption,) = result.preemptions
    assert (preemption.preemptor, preemption.node) == ("team/high", "a")
    assert [v.key for v in preemption.victims] == ["team/low"]
    assert preemption.victims[0] == Victim("team/low", "uid-low", 0, 300)
    assert preemption.kind == "replica" and not preemption.resumed
    assert "the engine preempts" in preemption.reason  # sharing.packing.preemption.engine_preemption chose
    (wait,) = result.waiting
    assert wait.preempting and "preempting 1 pod(s)" in wait.reason
    assert result.releases == ()


def test_among_equal_priorities_the_victim_with_least_milli_goes() -> None:
    pods = [pod("big", 0, on="a", milli=500), pod("small", 0, on="a", milli=100), pod("high", 100)]
    (preemption,) = run([mps_node("a")], pods).preemptions
    assert [v.key for v in preemption.victims] == ["team/small"]


@pytest.mark.parametrize(("preemptor", "running", "why"), [
    (pod("same", 50), 50, "equal priority never preempts"),
    (pod("lower", 10), 50, "lower priority never preempts"),
    (pod("never", 100, policy=NEVER), 0, "preemptionPolicy Never waits"),
], ids=["equal", "lower", "never"])
def test_no_preemption(preemptor: Pod, running: int, why: str) -> None:
    pods = [pod("x", running, on="a"), pod("y", running, on="a"), preemptor]
    result = run([mps_node("a")], pods)
    assert result.preemptions == (), why
    (wait,) = result.waiting
    assert not wait.preempting


def test_a_pod_kueue_holds_never_preempts() -> None:
    """Kueue's gate still on: no demand on either pool (Kueue preempts for quota, gpupack for capacity)."""
    held = Pod(**{**pod("high", 100).__dict__, "queue_held": True})
    assert run([mps_node("a")], [pod("low", 0, on="a"), pod("low2", 0, on="a"), held]).preemptions == ()
    dra_held = Pod(**{**dra_pod("high", 100, 500).__dict__, "queue_held": True})
    result = dra_run([dra_pod("low", 0, 600, on="a"), dra_pod("mid", 50, 300, on="a"), dra_held],
                     [dra_claim("low", "a", 600), dra_claim("mid", "a", 300)])
    assert result.preemptions == ()


def test_the_node_needing_the_fewest_victims_is_chosen_before_lower_priorities() -> None:
    """A two-container pod needs two replicas. Node a holds two pods of priority 0 and nothing free:
    two victims. Node b has one replica free and three pods of priority 20: one victim. b wins."""
    two = Pod(**{**pod("high", 100).__dict__, "milli": (400, 400), "memory_bytes": (None, None)})
    pods = [pod("a1", 0, on="a"), pod("a2", 0, on="a"), pod("b1", 20, on="b"), pod("b2", 20, on="b"),
            pod("b3", 30, on="b"), two]
    (preemption,) = run([mps_node("a"), mps_node("b", gpus=2)], pods).preemptions
    assert (preemption.node, [v.key for v in preemption.victims]) == ("b", ["team/b1"])


def test_with_as_many_victims_either_way_the_lower_priority_node_is_chosen() -> None:
    pods = [pod("a1", 10, on="a"), pod("a2", 10, on="a"), pod("b1", 0, on="b"), pod("b2", 90, on="b"),
            pod("high", 100)]
    (preemption,) = run([mps_node("a"), mps_node("b")], pods).preemptions
    assert (preemption.node, [v.key for v in preemption.victims]) == ("b", ["team/b1"])


def test_two_preemptors_in_one_cycle_never_share_a_victim() -> None:
    pods = [pod("low1", 0, on="a"), pod("low2", 0, on="a"), pod("h1", 100), pod("h2", 100, minutes_old=5)]
    result = run([mps_node("a")], pods)
    victims = [v.key for p in result.preemptions for v in p.victims]
    assert sorted(victims) == ["team/low1", "team/low2"]
    assert len(set(victims)) == len(victims)


def test_a_whole_gpu_pod_preempts_through_the_engine_on_an_unshared_node() -> None:
    """Two GPUs, each held by a whole-GPU pod: the engine frees the lower one for a one-GPU pod."""
    def whole(name: str, priority: int, on: str | None = None) -> Pod:
        return Pod("team", name, "whole", NOW - timedelta(minutes=5), milli=(1000,), memory_bytes=(None,),
                   gated=on is None, node=on, bound=on is not None, uid=f"uid-{name}", priority=PodPriority(priority))

    unshared = Node("w", H100.product, H100, (("pool", "a"),), "none", 1,
                    (Gpu(0, H100.memory_mib, False), Gpu(1, H100.memory_mib, False)), whole_taken=2)
    pods = [whole("low", 0, "w"), whole("mid", 50, "w"), whole("high", 100)]
    (preemption,) = run([unshared], pods).preemptions
    assert ([v.key for v in preemption.victims], preemption.kind) == (["team/low"], "whole-gpus")
    assert "the engine preempts" in preemption.reason


def test_a_mig_pod_preempts_a_lower_pod_holding_the_profile_it_needs() -> None:
    """MIG: the victim is one holding an instance of the pod's profile, not the one holding another."""
    threes = (PlacedInstance("3g.40gb", Placement(0, 4)), PlacedInstance("3g.40gb", Placement(4, 4)))
    busy = Gpu(0, H100.memory_mib, True, threes, threes)
    mig = Node("m", H100.product, H100, (("pool", "a"),), "none", 1, (busy,))

    def mig_pod(name: str, priority: int, profile: str = "3g.40gb", on: str | None = None) -> Pod:
        return Pod("team", name, "mig", NOW - timedelta(minutes=5), profiles=(profile,), milli=(400,),
                   memory_bytes=(None,), gated=on is None, node=on, bound=on is not None, uid=f"uid-{name}",
                   priority=PodPriority(priority))

    pods = [mig_pod("low", 0, on="m"), mig_pod("mid", 50, on="m"), mig_pod("high", 100)]
    (preemption,) = run([mig], pods).preemptions
    assert (preemption.node, preemption.kind, [v.key for v in preemption.victims]) == ("m", "mig-instance", ["team/low"])


def test_a_pod_too_big_for_the_split_reclaims_the_node_only_where_the_gate_allows_a_new_split() -> None:
    """The node shares into 2 replicas (500 milli each): a 900-milli pod has no place there however
    many replicas are freed. With the policy's gate open the engine reshapes it (every pod preempted,
    reason ``reshape``; the node is split anew for the pod once they are gone,
    ``tests/unit/test_planner_reclaim.py``); with no policy selecting the node, nothing."""
    pods = [pod("low", 0, on="a"), pod("low2", 0, on="a"), pod("huge", 100, milli=900)]
    (preemption,) = run([mps_node("a")], pods).preemptions
    assert (preemption.kind, sorted(v.key for v in preemption.victims)) == ("reshape", ["team/low", "team/low2"])
    uids = frozenset(p.uid for p in pods)
    assert plan(Snapshot((mps_node("a"),), tuple(pods), {}, present=uids), NOW).preemptions == ()


# ------------------------------------------------------------------ no second kill
def test_while_victims_terminate_the_preemptor_waits_with_its_place_held_and_preempts_nothing_more() -> None:
    """Next cycle: the victim is terminating (listed, so present, but no longer a claim). The place looks
    free; the preemptor takes it but waits, and a lower pod does not get it; nobody else is preempted."""
    preemptor = pod("high", 100, victims=("uid-low",))
    preemptor = Pod(**{**preemptor.__dict__, "node": "a"})  # pinned, still gated
    pods = [pod("mid", 50, on="a"), preemptor, pod("other-low", 0, minutes_old=60)]
    result = run([mps_node("a")], pods, present=frozenset({"uid-mid", "uid-high", "uid-other-low", "uid-low"}))
    assert result.preemptions == ()
    assert result.releases == ()
    waits = {w.pod: w for w in result.waiting}
    assert waits["team/high"].preempting and "1 pod(s) it preempted to terminate" in waits["team/high"].reason
    assert "team/other-low" in waits


def test_an_older_pod_of_equal_priority_never_takes_the_place_a_preemptor_freed() -> None:
    preemptor = Pod(**{**pod("high", 100, victims=("uid-low",), minutes_old=1).__dict__, "node": "a"})
    never = pod("older-never", 100, policy=NEVER, minutes_old=60)
    result = run([mps_node("a")], [pod("mid", 50, on="a"), never, preemptor])
    assert [r.pod for r in result.releases] == ["team/high"]
    assert [w.pod for w in result.waiting] == ["team/older-never"]


def test_once_victims_are_gone_the_preemptor_is_released_to_its_node() -> None:
    preemptor = Pod(**{**pod("high", 100, victims=("uid-low",)).__dict__, "node": "a"})
    result = run([mps_node("a")], [pod("mid", 50, on="a"), preemptor])
    assert [(r.pod, r.node) for r in result.releases] == [("team/high", "a")]
    assert result.preemptions == ()


def test_a_pod_that_preempted_never_preempts_again_while_its_place_is_still_reported_busy() -> None:
    """Its victim is gone, but the agent still reports the replica taken (a process outlives its pod
    object): the node looks full. The preemptor waits; the other low pod stays."""
    preemptor = Pod(**{**pod("high", 100, victims=("uid-gone",)).__dict__, "node": "a"})
    result = run([mps_node("a")], [pod("low", 0, on="a"), pod("low2", 0, on="a"), preemptor])
    assert result.preemptions == () and result.releases == ()


def test_a_victim_still_running_after_a_restart_is_deleted_again_not_replaced_by_others() -> None:
    """The controller pinned the preemptor and stopped before deleting: the same victim, resumed."""
    preemptor = Pod(**{**pod("high", 100, victims=("uid-low",)).__dict__, "node": "a"})
    result = run([mps_node("a")], [pod("low", 0, on="a"), pod("low2", 0, on="a"), preemptor])
    (again,) = result.preemptions
    assert again.resumed and [v.key for v in again.victims] == ["team/low"]


# ------------------------------------------------------------------ odd priority fields
def raw_pod(name: str, spec_extra: dict[str, Any]) -> dict[str, Any]:
    allocation = Allocation(mode="mps", gated=True, capacity_existed=True, policy="t", reason="t", replicas=2,
                            containers=(ContainerAllocation("main", "containers", 400, None, "nvidia.com/gpu.shared"),))
    return {
        "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}", "creationTimestamp": "2026-11-30T01:00:00Z",
                     "annotations": {ALLOCATION_ANNOTATION: allocation.to_annotation()}},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu.shared": "1"}}}],
                 "schedulingGates": [{"name": CAPACITY_GATE}], **spec_extra},
    }


@pytest.mark.parametrize("extra", [
    {"priority": "high"}, {"priority": True}, {"priority": 2**40}, {"priority": 1.5},
    {"preemptionPolicy": "Sometimes"}, {"priorityClassName": 7}, {"priority": 2_000_000_000},
], ids=["string", "bool", "huge", "float", "unknown-policy", "class-not-a-string", "system-value-user-class"])
def test_odd_priority_fields_never_stop_the_reader_and_never_preempt(extra: dict[str, Any]) -> None:
    read = pod_from_object(raw_pod("odd", extra))
    assert read is not None, "the pod is still gpupack's: it is planned"
    assert read.priority == PodPriority(0, NEVER)
    assert read.priority_problem is not None and "pod odd" in read.priority_problem


def test_priority_fields_the_api_server_writes_are_read() -> None:
    read = pod_from_object(raw_pod("ok", {"priority": 1000, "priorityClassName": "serving",
                                          "preemptionPolicy": "Never"}))
    assert read is not None and read.priority == PodPriority(1000, NEVER, "serving")
    assert read.priority_problem is None
    marked = raw_pod("pre", {})
    marked["metadata"]["annotations"][PREEMPTING_ANNOTATION] = "uid-a, uid-b,"
    read = pod_from_object(marked)
    assert read is not None and read.victims == ("uid-a", "uid-b")


# ------------------------------------------------------------------ writes
def test_the_preemptor_patch_pins_records_and_is_guarded_by_the_gates() -> None:
    obj = raw_pod("high", {})
    ops = preemptor_ops(obj, "a", ["uid-1", "uid-2"], pinned=False)
    assert ops[0] == {"op": "test", "path": "/spec/schedulingGates", "value": [{"name": CAPACITY_GATE}]}
    assert {"op": "add", "path": "/metadata/annotations/gpupack.io~1preempting", "value": "uid-1,uid-2"} in ops
    assert any("kubernetes.io/hostname" in str(o.get("value")) for o in ops)
    assert not any(o["path"] == "/spec/schedulingGates" and o["op"] != "test" for o in ops), "the gate stays"
    ungated = {**obj, "spec": {**obj["spec"], "schedulingGates": []}}
    with pytest.raises(ValueError, match="not gated"):
        preemptor_ops(ungated, "a", ["uid-1"], pinned=False)


class RecordingKube(KubeClient):
    def __init__(self, fail_pin: bool = False) -> None:
        super().__init__(api=None)  # type: ignore[arg-type]
        self.calls: list[tuple[str, str, Any]] = []
        self.fail_pin = fail_pin

    def json_patch_pod(self, namespace: str, name: str, ops: Any) -> None:
        if self.fail_pin:
            raise KubeError(422, "test failed: gates changed")
        self.calls.append(("pin", f"{namespace}/{name}", ops))

    def patch_pod_status(self, namespace: str, name: str, body: Any) -> None:
        self.calls.append(("status", f"{namespace}/{name}", body))

    def event(self, involved: Any, type_: str, reason: str, message: str, host: str | None = None) -> None:
        self.calls.append(("event", f"{involved['namespace']}/{involved['name']}", (type_, reason, message)))

    def delete_pod(self, namespace: str, name: str, uid: str, resource_version: str | None) -> bool:
        self.calls.append(("delete", f"{namespace}/{name}", (uid, resource_version)))
        return True


PREEMPTION = Preemption("team/high", "a", (Victim("team/low", "uid-low", 0, 400),), "test", "replica")


def test_the_controller_pins_first_then_marks_tells_and_deletes_each_victim() -> None:
    kube = RecordingKube()
    controller = Controller(kube, ControllerSettings(), clock=lambda: NOW)  # type: ignore[arg-type]
    report = CycleReport()
    controller._preempt([PREEMPTION], {"team/high": raw_pod("high", {})}, NOW, report)  # noqa: SLF001
    assert [(c[0], c[1]) for c in kube.calls] == [("pin", "team/high"), ("status", "team/low"),
                                                  ("event", "team/low"), ("delete", "team/low")]
    condition = kube.calls[1][2]["status"]["conditions"][0]
    assert (condition["type"], condition["reason"], condition["status"]) == ("DisruptionTarget", PREEMPTION_REASON, "True")
    assert "team/high" in condition["message"]
    assert kube.calls[2][2][1] == "Preempted" and "team/high" in kube.calls[2][2][2]
    assert kube.calls[3][2] == ("uid-low", None), "uid precondition only; the pod's own grace period"
    assert report.preempted == ["team/low"] and report.errors == []
    assert controller.metrics.registry.get_sample_value("gpupack_preemptions_total", {"reason": "replica"}) == 1


def test_nothing_is_deleted_when_the_preemptor_cannot_be_pinned() -> None:
    kube = RecordingKube(fail_pin=True)
    controller = Controller(kube, ControllerSettings(), clock=lambda: NOW)  # type: ignore[arg-type]
    report = CycleReport()
    controller._preempt([PREEMPTION], {"team/high": raw_pod("high", {})}, NOW, report)  # noqa: SLF001
    assert kube.calls == [] and report.preempted == []
    assert any("not pinned, nothing preempted" in e for e in report.errors)
    assert controller.metrics.registry.get_sample_value("gpupack_preemptions_total", {"reason": "replica"}) is None


def test_disruption_condition_body() -> None:
    body = disruption_patch(PREEMPTION, NOW)
    (condition,) = body["status"]["conditions"]
    assert condition["lastTransitionTime"] == "2026-11-30T02:00:00Z"
    assert "node a" in condition["message"]


# ------------------------------------------------------------------ the DRA pool
def dra_pod(name: str, priority: int, milli: int, *, on: str | None = None, victims: tuple[str, ...] = (),
            policy: str = PREEMPT_LOWER_PRIORITY) -> Pod:
    return Pod("team", name, "mps", NOW - timedelta(minutes=10), milli=(milli,), memory_bytes=(None,),
               gated=on is None, node=on, bound=on is not None, uid=f"uid-{name}", backend="dra",
               claim=f"claim-{name}", requests=("gpu-0",), terms=(((BACKEND_LABEL, "In", ("dra",)),),),
               priority=PodPriority(priority, policy), victims=victims)


def dra_claim(name: str, node_name: str, milli: int) -> dict[str, Any]:
    result = {"request": "gpu-0", "driver": names.DRIVER, "pool": node_name, "device": "gpu-0-shared",
              "consumedCapacity": {names.MILLI: str(milli), names.MEMORY: str(GiB)}}
    return {"metadata": {"namespace": "team", "name": f"claim-{name}"},
            "status": {"allocation": {"devices": {"results": [result]}}}}


def dra_run(pods: list[Pod], claims: list[dict[str, Any]], present: frozenset[str] | None = None) -> DraPlan:
    nodes = (Node("a", H100.product, H100, ((BACKEND_LABEL, "dra"),), "mps", 1, (Gpu(0, H100.memory_mib, False),),
                  spec_sharing="mps"),)
    uids = frozenset(p.uid for p in pods) if present is None else present
    snapshot = Snapshot(nodes, tuple(pods), {}, present=uids)
    return plan_dra(snapshot, read_usage(claims, nodes), NOW)


def test_dra_a_share_that_fits_nowhere_preempts_the_lowest_priority_claim_holder() -> None:
    pods = [dra_pod("low", 0, 600, on="a"), dra_pod("mid", 50, 300, on="a"), dra_pod("high", 100, 500)]
    result = dra_run(pods, [dra_claim("low", "a", 600), dra_claim("mid", "a", 300)])
    assert result.placements == ()
    (preemption,) = result.preemptions
    assert (preemption.preemptor, preemption.node, [v.key for v in preemption.victims]) == ("team/high", "a", ["team/low"])
    (wait,) = result.waiting
    assert wait.preempting


@pytest.mark.parametrize(("priority", "policy"), [(50, PREEMPT_LOWER_PRIORITY), (100, NEVER)], ids=["equal", "never"])
def test_dra_no_preemption_of_equal_priority_or_for_never(priority: int, policy: str) -> None:
    pods = [dra_pod("x", 50, 600, on="a"), dra_pod("y", 50, 300, on="a"), dra_pod("p", priority, 500, policy=policy)]
    result = dra_run(pods, [dra_claim("x", "a", 600), dra_claim("y", "a", 300)])
    assert result.preemptions == () and not result.waiting[0].preempting


def test_dra_a_preemptor_waits_while_its_victim_terminates_and_preempts_no_one_else() -> None:
    """The victim is terminating: listed (present), not a pod of the snapshot; its claim still holds."""
    high = Pod(**{**dra_pod("high", 100, 500, victims=("uid-low",)).__dict__, "node": "a"})
    pods = [dra_pod("mid", 50, 300, on="a"), high]
    result = dra_run(pods, [dra_claim("low", "a", 600), dra_claim("mid", "a", 300)],
                     present=frozenset({"uid-low", "uid-mid", "uid-high"}))
    assert result.preemptions == () and result.placements == ()
    assert result.waiting[0].preempting and "to terminate" in result.waiting[0].reason


def test_a_scoped_controller_never_preempts_a_pod_outside_its_namespaces() -> None:
    kube = RecordingKube()
    controller = Controller(kube, ControllerSettings(namespaces="other"), clock=lambda: NOW)  # type: ignore[arg-type]
    report = CycleReport()
    controller._preempt([PREEMPTION], {"team/high": raw_pod("high", {})}, NOW, report)  # noqa: SLF001
    assert kube.calls == [] and report.preempted == []


# ------------------------------------------------------------------ PodDisruptionBudgets
def budget(namespace: str, selector: Any, allowed: Any) -> dict[str, Any]:
    spec = {} if selector is None else {"selector": selector}
    return {"metadata": {"namespace": namespace, "name": "b"}, "spec": spec,
            "status": {} if allowed is None else {"disruptionsAllowed": allowed}}


LABELLED = {f"team/{n}": {"metadata": {"labels": labels}} for n, labels in
            [("web", {"app": "web", "tier": "front"}), ("batch", {"app": "batch"}), ("bare", {})]}


@pytest.mark.parametrize(("budgets", "protected"), [
    ([budget("team", {"matchLabels": {"app": "web"}}, 0)], {"team/web"}),
    ([budget("team", {"matchLabels": {"app": "web"}}, 1)], set()),
    ([budget("other", {"matchLabels": {"app": "web"}}, 0)], set()),
    ([budget("team", {}, 0)], {"team/web", "team/batch", "team/bare"}),
    ([budget("team", None, 0)], set()),
    ([budget("team", {"matchExpressions": [{"key": "app", "operator": "In", "values": ["batch", "x"]}]}, 0)],
     {"team/batch"}),
    ([budget("team", {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, 0)],
     {"team/batch", "team/bare"}),
    ([budget("team", {"matchExpressions": [{"key": "app", "operator": "Sometimes"}]}, 0)], set()),
    ([budget("team", {}, None)], set()),
    ([budget("team", {}, "0")], set()),
], ids=["match", "disruption-left", "other-namespace", "empty-selects-all", "no-selector", "in", "does-not-exist",
        "unknown-operator", "not-judged-yet", "unreadable-status"])
def test_the_pods_a_budget_protects(budgets: list[dict[str, Any]], protected: set[str]) -> None:
    assert protected_pods(budgets, LABELLED) == protected


def test_preemption_prefers_victims_no_budget_protects_and_still_preempts_when_only_they_make_room() -> None:
    pods = [pod("a1", 0, on="a"), pod("a2", 10, on="a"), pod("b1", 20, on="b"), pod("b2", 90, on="b"),
            pod("high", 100)]
    nodes = [mps_node("a"), mps_node("b")]
    snapshot = Snapshot(tuple(nodes), tuple(pods), {n.name: POLICY for n in nodes}, present=frozenset(p.uid for p in pods))
    (unprotected,) = plan(snapshot, NOW).preemptions
    assert [v.key for v in unprotected.victims] == ["team/a1"]
    (preferred,) = plan(snapshot, NOW, protected=frozenset({"team/a1", "team/a2"})).preemptions
    assert [v.key for v in preferred.victims] == ["team/b1"], "the budget's pods are spared where others make room"
    (forced,) = plan(snapshot, NOW, protected=frozenset({"team/a1", "team/a2", "team/b1", "team/b2"})).preemptions
    assert [v.key for v in forced.victims] == ["team/a1"], "as kube-scheduler, it still preempts when it must"


class BudgetKube(RecordingKube):
    def __init__(self, budgets: list[dict[str, Any]] | None) -> None:
        super().__init__()
        self.budgets, self.reads = budgets, 0

    def list_pod_disruption_budgets(self) -> list[dict[str, Any]]:
        self.reads += 1
        if self.budgets is None:
            raise KubeError(403, "forbidden")
        return self.budgets


def test_budgets_are_read_once_a_cycle_and_only_when_a_plan_preempts() -> None:
    from controller.reconcile import _Budgets  # noqa: PLC0415 - the reconciler's private reader

    kube = BudgetKube([budget("team", {"matchLabels": {"app": "web"}}, 0)])
    controller = Controller(kube, ControllerSettings(), clock=lambda: NOW)  # type: ignore[arg-type]
    report = CycleReport()
    budgets = _Budgets(controller, LABELLED, report)
    assert budgets.protecting(()) == frozenset() and kube.reads == 0
    web = Preemption("team/high", "a", (Victim("team/web", "u", 0, 100),), "t", "replica")
    batch = Preemption("team/high", "a", (Victim("team/batch", "u", 0, 100),), "t", "replica")
    assert budgets.protecting([batch]) == frozenset()
    assert budgets.protecting([web]) == {"team/web"}
    assert kube.reads == 1
    failing = BudgetKube(None)
    report = CycleReport()
    lost = _Budgets(Controller(failing, ControllerSettings(), clock=lambda: NOW), LABELLED, report)  # type: ignore[arg-type]
    assert lost.protecting([web]) == frozenset()
    assert any("PodDisruptionBudgets not read" in e for e in report.errors)
