"""Priority and preemption in the live controller, on the real control plane (issue 36, item 1).

The controller e2e harness (``tests.e2e.test_controller_e2e``, its fixture ``h``): real kube-apiserver, etcd and
kube-scheduler, gpupack's RBAC and admission policies, a simulated H100 node (``gpupack agent run
--simulate``, device plugin emulated) and ``gpupack controller run`` as its ServiceAccount, scoped to
the test's namespace. Pods carry the allocation record the webhook would write and real
PriorityClasses, which the API server's Priority admission resolves into ``spec.priority``.

The node's one GPU is cut into two ``3g.40gb`` instances (or shared by MPS into two replicas),
both held by pods of a low class: the node is full. A ``preemptionPolicy: Never`` pod of the high class waits; a pod of the high class
that may preempt gets one victim, which carries the ``DisruptionTarget`` condition
(``PreemptionByGpupack``) and a ``Preempted`` Event and is deleted with its grace period. There is no
kubelet: the victim stays Terminating, and meanwhile the preemptor waits pinned to the node and no
second pod is preempted; the test then plays the kubelet (the pod is gone) and the preemptor is
released and bound to the freed instance. A pod asking ``nvidia.com/gpu`` itself reclaims a node
whose replicas all hold low pods: both are preempted, and the node is switched back to whole GPUs
for it once they are gone; a gated pod too big for a node's split reclaims it, and the node is
split anew at the pod's size. An unknown PriorityClass is refused by the API server.
Deadlines only, no timing assertions.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any, cast

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sharing.api.allocation import Allocation, ContainerAllocation
from sharing.api.keys import ALLOCATION_ANNOTATION, CAPACITY_GATE, PREEMPTING_ANNOTATION, PREEMPTION_REASON
from sharing.api.preempting import read_preempting
from tests.e2e.test_controller_e2e import H100, Harness, h  # noqa: F401 - h: the harness fixture
from tests.e2e.waiting import wait_for

PROFILE = "3g.40gb"


class Priorities:
    """The controller harness's run, with PriorityClasses of its own (cluster-scoped, removed after)
    and pods that name them."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.scheduling = client.SchedulingV1Api(h.admin)
        self.classes: list[str] = []

    def priority_class(self, suffix: str, value: int, policy: str = "PreemptLowerPriority") -> str:
        name = f"e2e-{self.h.run}-{suffix}"
        self.scheduling.create_priority_class(cast(Any, {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                                         "metadata": {"name": name}, "value": value,
                                                         "preemptionPolicy": policy}))
        self.classes.append(name)
        return name

    def gpu_pod(self, name: str, priority_class: str, kind: str, milli: int = 400,
                profile: str = PROFILE) -> dict[str, Any]:
        """A gated pod as the webhook leaves it: a ``profile`` instance (``mig``) or an MPS replica
        (``mps``) of ``milli``."""
        resource = f"nvidia.com/mig-{profile}" if kind == "mig" else "nvidia.com/gpu.shared"
        allocation = Allocation(
            mode="mig" if kind == "mig" else "mps", gated=True, capacity_existed=False, policy="e2e", reason="e2e",
            gpu_model=H100,
            # 400 milli: a replica of a split into two, never of one into three.
            containers=(ContainerAllocation("main", "containers", 300 if kind == "mig" else milli, None, resource,
                                            profile if kind == "mig" else None),),
        )
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "annotations": {ALLOCATION_ANNOTATION: allocation.to_annotation()}},
                "spec": {"priorityClassName": priority_class, "terminationGracePeriodSeconds": 30,
                         "schedulingGates": [{"name": CAPACITY_GATE}],
                         "containers": [{"name": "main", "image": "example.com/app:1",
                                         "resources": {"limits": {resource: "1"}}}],
                         "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                             "nodeSelectorTerms": [{"matchExpressions": [
                                 {"key": "e2e-ctl", "operator": "In", "values": [self.h.run]}]}]}}}}}

    def create(self, body: dict[str, Any]) -> str:
        self.h.core.create_namespaced_pod(self.h.namespace, cast(Any, body))
        return str(body["metadata"]["name"])

    def pod(self, name: str) -> Any:
        try:
            return self.h.core.read_namespaced_pod(name, self.h.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise


@pytest.fixture
def p(h: Harness) -> Iterator[Priorities]:
    priorities = Priorities(h)
    yield priorities
    for name in priorities.classes:
        priorities.scheduling.delete_priority_class(name)


def _disruption(pod: Any) -> Any:
    return next((c for c in pod.status.conditions or [] if c.type == "DisruptionTarget"), None)


@pytest.mark.parametrize("kind", ["mig", "mps"])
def test_a_high_priority_pod_preempts_one_low_pod_and_runs_in_its_place(h: Harness, p: Priorities, kind: str) -> None:
    """``mig``: the controller's own ranking of MIG victims; ``mps``: the engine's
    (``sharing.packing.preemption.engine_preemption``) on a node shared by MPS into two replicas."""
    node = h.node("a", 1, {0: [PROFILE, PROFILE]}) if kind == "mig" else h.node("a", 1, mps=2)
    h.policy()
    low, high, never = p.priority_class("low", 10), p.priority_class("high", 1000), \
        p.priority_class("high-never", 1000, "Never")
    h.controller("ctl-prio")
    lows = [p.create(p.gpu_pod(f"low-{i}", low, kind)) for i in range(2)]
    for name in lows:
        assert wait_for(f"{name} to be bound", partial(h.node_of, name), timeout_s=90) == node
    assert p.pod(lows[0]).spec.priority == 10  # the API server resolved the class

    # A Never pod of the high class waits: the node is full, and it may not preempt.
    waiter = p.create(p.gpu_pod("high-never", never, kind))
    wait_for("the Never pod to be told it waits", lambda: any(
        c.type == "gpupack.io/Placement" for c in (p.pod(waiter).status.conditions or [])), timeout_s=60)
    assert all(p.pod(n).metadata.deletion_timestamp is None for n in lows), "a Never pod preempted"

    preemptor = p.create(p.gpu_pod("high", high, kind))
    victim = wait_for("a low pod to be preempted", lambda: next(
        (n for n in lows if p.pod(n) is not None and p.pod(n).metadata.deletion_timestamp is not None), None),
        timeout_s=90)
    doomed = p.pod(victim)
    condition = _disruption(doomed)
    assert condition is not None and condition.status == "True" and condition.reason == PREEMPTION_REASON
    assert f"{h.namespace}/{preemptor}" in condition.message
    assert doomed.metadata.deletion_grace_period_seconds == 30, "deleted with its own grace period"
    events = h.core.list_namespaced_event(h.namespace, field_selector=f"involvedObject.name={victim}").items
    assert any(e.reason == "Preempted" and preemptor in (e.message or "") for e in events)

    # While the victim terminates, the preemptor waits pinned and records its victim; nobody else goes.
    pinned = wait_for("the preemptor to wait for its victim", lambda: (
        (seen := p.pod(preemptor)) is not None and seen.spec.scheduling_gates
        and "terminate" in next((c.message for c in seen.status.conditions or []
                                 if c.type == "gpupack.io/Placement"), "") and seen), timeout_s=60)
    assert pinned.metadata.annotations[PREEMPTING_ANNOTATION] == doomed.metadata.uid
    terms = pinned.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
    assert all(any(e.key == "kubernetes.io/hostname" and e.values == [node] for e in t.match_expressions)
               for t in terms)
    spared = next(n for n in lows if n != victim)
    assert p.pod(spared).metadata.deletion_timestamp is None, "a second pod was preempted for one preemptor"

    # The test plays the kubelet: the victim's containers have stopped, the pod is gone.
    h.core.delete_namespaced_pod(victim, h.namespace, grace_period_seconds=0)
    assert wait_for("the preemptor to be bound to the freed node", lambda: h.node_of(preemptor),
                    timeout_s=90) == node
    assert p.pod(spared).metadata.deletion_timestamp is None
    never_pod = p.pod(waiter)
    assert never_pod.spec.node_name is None and never_pod.spec.scheduling_gates, "the Never pod still waits"
    log = h.log("ctl-prio")
    assert f"preempted {h.namespace}/{victim} for {h.namespace}/{preemptor} on {node}" in log
    assert ("the engine preempts" in log) == (kind == "mps")  # whose choice: the engine's for a replica
    assert " failed: " not in log, "a write or the PodDisruptionBudgets' read failed (the controller's grants)"


def test_a_plain_whole_gpu_pod_reclaims_a_best_effort_node_and_is_bound_there(h: Harness, p: Priorities) -> None:
    """A pod asking ``nvidia.com/gpu`` itself, of the high class, and a node shared by MPS whose two
    replicas hold low pods: kube-scheduler's own preemption finds nothing (no node offers a whole GPU),
    so gpupack's controller preempts both replicas (the engine's ``reshape``), records them and the node
    on the pod (``gpupack.io/preempting``), and once the victims are gone switches the node back to
    whole GPUs; kube-scheduler then binds the pod there."""
    node = h.node("a", 1, mps=2)
    h.policy()
    low, high = p.priority_class("low", 10), p.priority_class("high", 1000)
    h.controller("ctl-reclaim")
    lows = [p.create(p.gpu_pod(f"low-{i}", low, "mps")) for i in range(2)]
    for name in lows:
        assert wait_for(f"{name} to be bound", partial(h.node_of, name), timeout_s=90) == node
    plain = p.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "llm"},
                      "spec": {"priorityClassName": high, "terminationGracePeriodSeconds": 30,
                               "containers": [{"name": "main", "image": "example.com/app:1",
                                               "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                               "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                                   "nodeSelectorTerms": [{"matchExpressions": [
                                       {"key": "e2e-ctl", "operator": "In", "values": [h.run]}]}]}}}}})
    wait_for("both low pods to be preempted", lambda: all(
        (seen := p.pod(n)) is not None and seen.metadata.deletion_timestamp is not None for n in lows), timeout_s=90)
    doomed = [p.pod(n) for n in lows]
    for victim in doomed:
        condition = _disruption(victim)
        assert condition is not None and condition.reason == PREEMPTION_REASON
        assert f"{h.namespace}/{plain}" in condition.message and victim.metadata.deletion_grace_period_seconds == 30
    record = read_preempting(p.pod(plain).metadata.annotations)
    assert record is not None and record.node == node
    assert sorted(record.victims) == sorted(v.metadata.uid for v in doomed)
    # While the victims terminate the node keeps sharing: nothing switched under running pods.
    assert h.gpunode(node)["spec"]["sharing"]["mode"] == "mps"
    assert p.pod(plain).spec.node_name is None

    for name in lows:  # the test plays the kubelet: the victims' containers have stopped
        h.core.delete_namespaced_pod(name, h.namespace, grace_period_seconds=0)
    assert wait_for("the plain pod to be bound to the reclaimed node", lambda: h.node_of(plain), timeout_s=120) == node
    assert h.gpunode(node)["spec"]["sharing"]["mode"] == "none"
    log = h.log("ctl-reclaim")
    assert f"preempted {h.namespace}/{lows[0]} for {h.namespace}/{plain} on {node}" in log
    assert " failed: " not in log, "a write failed (the controller's grants)"


def test_a_pod_too_big_for_the_split_reclaims_the_node_and_runs_there_split_anew(h: Harness, p: Priorities) -> None:
    """A gated MPS pod of 400 milli of the high class and a node whose GPU the controller split for four
    low pods of 200 milli (into more than two replicas, the demand's split): no replica of that split
    fits the pod however many go, so the controller preempts all four (the engine's ``reshape``), pins
    the pod to the node and, once they are gone, splits the node anew at the pod's own size (two
    replicas); the pod is then released and bound there."""
    node = h.node("a", 1, mps=4)
    h.policy()
    low, high = p.priority_class("low", 10), p.priority_class("high", 1000)
    h.controller("ctl-resplit")
    lows = [p.create(p.gpu_pod(f"low-{i}", low, "mps", milli=200)) for i in range(4)]
    for name in lows:
        assert wait_for(f"{name} to be bound", partial(h.node_of, name), timeout_s=90) == node
    split = h.gpunode(node)["spec"]["sharing"]
    assert split["mode"] == "mps" and split["replicas"] > 2
    big = p.create(p.gpu_pod("big", high, "mps", milli=400))
    wait_for("the low pods to be preempted", lambda: all(
        (seen := p.pod(n)) is not None and seen.metadata.deletion_timestamp is not None for n in lows), timeout_s=90)
    assert h.gpunode(node)["spec"]["sharing"] == split, "switched under terminating pods"
    for name in lows:  # the test plays the kubelet
        h.core.delete_namespaced_pod(name, h.namespace, grace_period_seconds=0)
    assert wait_for("the big pod to be bound to the re-split node", lambda: h.node_of(big), timeout_s=120) == node
    assert h.gpunode(node)["spec"]["sharing"] == {"mode": "mps", "replicas": 2}
    log = h.log("ctl-resplit")
    assert f"reclaimed for {h.namespace}/{big}" in log and " failed: " not in log


def test_a_mig_pod_has_a_gpu_re_laid_out_for_it(h: Harness, p: Priorities) -> None:
    """A GPU cut into seven ``1g.10gb`` instances, each held by a low pod: no instance of ``3g.40gb``
    exists to free, so the controller preempts the fewest low pods whose instances, destroyed, leave a
    valid ``3g.40gb`` placement (three: those on slices 4-6), holds the node for the preemptor and, once
    they are gone, re-lays the GPU out (their instances out, a ``3g.40gb`` in); the preemptor is then
    released and bound there, and the four other low pods run on."""
    one = "1g.10gb"
    node = h.node("r", 1, {0: [one] * 7})
    h.policy()
    low, high = p.priority_class("low", 10), p.priority_class("high", 1000)
    h.controller("ctl-mig-reshape")
    lows = [p.create(p.gpu_pod(f"low-{i}", low, "mig", milli=100, profile=one)) for i in range(7)]
    for name in lows:
        assert wait_for(f"{name} to be bound", partial(h.node_of, name), timeout_s=90) == node
    big = p.create(p.gpu_pod("big", high, "mig"))

    record = wait_for("the preemptor to record its victims", lambda: read_preempting(
        p.pod(big).metadata.annotations or {}), timeout_s=120)
    uids = {p.pod(n).metadata.uid: n for n in lows}
    victims = sorted(uids[u] for u in record.victims)
    assert len(victims) == 3, victims
    wait_for("the three to be preempted", lambda: all(
        (seen := p.pod(n)) is not None and _disruption(seen) is not None and seen.metadata.deletion_timestamp
        for n in victims), timeout_s=90)
    assert h.layouts(node)[0] == [one] * 7, "re-laid out under terminating pods"
    for name in victims:  # the test plays the kubelet
        h.core.delete_namespaced_pod(name, h.namespace, grace_period_seconds=0)
    assert wait_for("the 3g.40gb pod to be bound to the re-laid-out GPU", lambda: h.node_of(big),
                    timeout_s=180) == node
    assert h.layouts(node)[0] == sorted([one] * 4 + [PROFILE])
    assert all(p.pod(n).metadata.deletion_timestamp is None for n in lows if n not in victims)
    log = h.log("ctl-mig-reshape")
    assert f"to re-lay out GPU 0 for {PROFILE}" in log and " failed: " not in log, log[-3000:]


def test_an_unknown_priority_class_is_refused_by_the_api_server(h: Harness, p: Priorities) -> None:
    body = p.gpu_pod("unknown-class", f"no-such-class-{h.run}", "mig")
    with pytest.raises(ApiException) as refused:
        p.create(body)
    assert refused.value.status == 403
    assert f"no PriorityClass with name no-such-class-{h.run} was found" in str(refused.value.body)
