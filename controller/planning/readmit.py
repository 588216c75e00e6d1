"""Pods stranded in the mode the webhook chose for them: which to re-admit, purely.

An ``auto`` pod (no ``gpupack.io/sharing`` annotation, or ``auto``) has its mode chosen by the
webhook from the GPUNodes' last reported status. A burst of such pods is decided against the
same status: every pod of it sees the same free MPS replicas, and all are recorded ``mps``
(issue 33, item 5: 20 pods recorded ``mps``, 4 waited over 90 s while MIG instances sat idle).
On the device-plugin pool the mode lives in the pod's extended resources
(``nvidia.com/gpu.shared`` or ``nvidia.com/mig-<profile>``), which cannot change after the pod
is created, so the pod object cannot be moved to another mode.

The rule: a gated pod that let gpupack choose its mode, that the planner left waiting this
cycle, and for which the webhook's own decision (:func:`sharing.admission.decision.decide`), taken again
over the controller's view of the cluster now, picks **another** mode **with capacity now**,
is stranded in its mode. The controller (``controller.reconcile``) then deletes it when a
controller (ReplicaSet, Job, StatefulSet...) owns it, so that its owner re-creates it and the
webhook decides again; the pod is gated, so it never ran and nothing is disrupted. A bare pod
is never deleted: its Placement condition tells the user to re-create it.

Only pods at least :data:`READMIT_AFTER_SECONDS` old, at most :data:`READMITS_PER_CYCLE` a cycle
(oldest first): capacity in flight for a pod that just arrived is not pre-empted, and a burst
is re-admitted in steps the next cycles re-judge.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from controller.planning.planner import Plan, Wait
from controller.state.pods import read_record
from controller.state.snapshot import Pod, Snapshot
from sharing.api.allocation import Allocation
from sharing.admission.decision import DecisionMemo, decide
from sharing.admission.inventory import AdmissionPolicy, Inventory
from sharing.api.fields import as_list, as_map
from sharing.api.workload import controller_owner
from sharing.api.request import AdmissionRefusal, ContainerRequest, PodRequest, parse_mode

READMIT_AFTER_SECONDS: Final = 10
"""A pod is re-admitted only once it has waited this long: most pods get capacity within seconds."""

READMITS_PER_CYCLE: Final = 10
"""At most this many pods are re-admitted a cycle (the oldest first)."""

AUTO_REASON_PREFIX: Final = "auto ->"
"""How the webhook's record says the mode was its choice (``sharing.admission.decision``: ``"<asked> -> <mode>: ..."``)."""


@dataclass(frozen=True)
class Readmission:
    """One stranded pod and what to do with it."""

    pod: str
    """``namespace/name``."""
    recorded: str
    chosen: str
    uid: str
    resource_version: str
    owner: Mapping[str, Any] | None
    """The pod's controller ownerReference; None for a bare pod (never deleted)."""

    @property
    def why(self) -> str:
        return (f"recorded {self.recorded}, and no {self.recorded} capacity holds it; "
                f"{self.chosen} has room now")

    @property
    def bare_message(self) -> str:
        """What a bare pod's Placement condition adds: the user's way out."""
        return f"{self.why}: delete and re-create the pod to let gpupack choose again"


def chose_mode(obj: Mapping[str, Any], allocation: Allocation) -> bool:
    """The user let gpupack choose: the pod asks ``auto`` and the webhook's record says so."""
    try:
        asked = parse_mode(dict(obj))
    except AdmissionRefusal:
        return False
    return asked == "auto" and allocation.reason.startswith(AUTO_REASON_PREFIX)


def request_of(obj: Mapping[str, Any], allocation: Allocation, namespace: str, name: str) -> PodRequest:
    """The pod's ask as the webhook read it, from the record (the webhook dropped the pod's own
    ``gpupack.io/*`` resources; the record keeps each container's milli and memory)."""
    spec = as_map(obj.get("spec"))
    containers: list[ContainerRequest] = []
    for c in allocation.containers:
        items = as_list(spec.get(c.kind))
        index = next((i for i, x in enumerate(items) if as_map(x).get("name") == c.name), 0)
        own = as_map(items[index]) if index < len(items) else {}
        sidecar = c.kind == "initContainers" and own.get("restartPolicy") == "Always"
        containers.append(ContainerRequest(c.kind, index, c.name, c.milli, c.memory_bytes, sidecar,
                                           predicted_milli=c.predicted_milli))
    return PodRequest(namespace, name, "auto", tuple(containers))


def stranded_in(obj: Mapping[str, Any], allocation: Allocation, pod: Pod, policy: AdmissionPolicy,
                inventory: Inventory, now: datetime, memo: DecisionMemo | None = None) -> str | None:
    """The mode the webhook would now choose for this waiting pod, when it is another mode with
    capacity now and the pod let gpupack choose; else None (module docstring). ``memo``: one for
    ``inventory`` (a backlog of pods of a few shapes asks the same question)."""
    if not pod.gated or pod.backend == "dra" or not chose_mode(obj, allocation):
        return None
    if now - pod.created < timedelta(seconds=READMIT_AFTER_SECONDS):
        return None
    try:
        decision = decide(request_of(obj, allocation, pod.namespace, pod.name), policy, inventory,
                          engine_places=True, backend=pod.backend, memo=memo)
    except AdmissionRefusal:
        return None
    if decision.mode == allocation.mode or not decision.capacity_exists:
        return None
    return decision.mode


def readmissions(plan: Plan, snapshot: Snapshot, pods: Mapping[str, Mapping[str, Any]],
                 inventory: Callable[[], Inventory], now: datetime,
                 limit: int = READMITS_PER_CYCLE) -> list[Readmission]:
    """The stranded pods among those ``plan`` leaves waiting, oldest first, at most ``limit``.
    ``inventory``: the cluster as the webhook reads it, built only when a pod is a candidate."""
    # A pod Kueue holds is not stranded in its mode: it waits for its quota, not for capacity; a preemptor
    # keeps the place its preemption frees.
    waiting = {w.pod for w in plan.waiting if not (w.deferred or w.held or w.preempting)}
    candidates = sorted((p for p in snapshot.pods if p.key in waiting and p.gated and p.backend != "dra"
                         and now - p.created >= timedelta(seconds=READMIT_AFTER_SECONDS)),
                        key=lambda p: (p.created, p.key))
    out: list[Readmission] = []
    view: Inventory | None = None
    memo: DecisionMemo | None = None
    for pod in candidates:
        if len(out) >= limit:
            break
        obj = pods.get(pod.key)
        if obj is None:
            continue
        _, allocation, _ = read_record(obj)
        if allocation is None or not chose_mode(obj, allocation):
            continue
        if view is None or memo is None:
            view = inventory()
            memo = DecisionMemo(view)
        chosen = stranded_in(obj, allocation, pod, memo.policy_for(pod.namespace), view, now, memo)
        if chosen is None:
            continue
        meta = as_map(obj.get("metadata"))
        out.append(Readmission(pod.key, allocation.mode, chosen, str(meta.get("uid") or ""),
                               str(meta.get("resourceVersion") or ""), controller_owner(obj)))
    return out


def with_messages(plan: Plan, bare: Mapping[str, Readmission], deleted: set[str]) -> Plan:
    """``plan`` with each bare stranded pod's wait saying how to let gpupack choose again, and the
    deleted pods' waits dropped (nothing to say on a pod that is gone)."""
    waits = tuple(Wait(w.pod, f"{w.reason}; {bare[w.pod].bare_message}", w.deferred) if w.pod in bare else w
                  for w in plan.waiting if w.pod not in deleted)
    return Plan(plan.layouts, plan.sharing, plan.releases, waits)


__all__ = ["READMITS_PER_CYCLE", "READMIT_AFTER_SECONDS", "Readmission", "chose_mode", "controller_owner",
           "readmissions", "request_of", "stranded_in", "with_messages"]
