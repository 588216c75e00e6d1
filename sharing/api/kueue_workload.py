"""Kueue's verdict on a pod it holds: the few fields of its ``Workload`` gpupack reads, and what they mean.

Kueue (v0.17, ``kueue.x-k8s.io/v1beta2``) makes one ``Workload`` per queued plain pod, owned by
the pod (an ``ownerReference`` with the pod's ``uid``), and says in its ``status.conditions``
why it has not admitted it. gpupack reads two of them (Kueue's ``apis/kueue/v1beta2/workload_types.go``):

* ``QuotaReserved``: ``False`` with reason ``Pending`` and the flavor assigner's message while
  the pod waits for quota (``pkg/scheduler/scheduler.go``), or reason ``Inadmissible`` when its
  LocalQueue or ClusterQueue is missing or stopped (``pkg/controller/core/workload_controller.go``);
* ``Admitted``: ``True`` once quota is reserved and every admission check passed.

A pod that asks more than its ClusterQueue can ever give is told so in Kueue's own words
(``pkg/scheduler/flavorassigner/flavorassigner.go``): ``insufficient quota for <resource> in
flavor <f>, ... > maximum capacity (<n>)`` (nominal quota plus borrowing limit, as far as the
cohort has it) or ``resource <r> unavailable in ClusterQueue``; one that waits its turn reads
``insufficient unused quota for <resource> in flavor <f>, <n> more needed``. :func:`never_admitted`
tells the two apart: a pod is *never* admitted while the queues stand as they are when every
reason Kueue gives is of the first kind (a message that also names unused quota leaves a flavor
where waiting helps).

:func:`read_workload` parses a raw Workload (a dict, as the API sends it): unknown fields are
ignored; a Workload without the fields gpupack needs is a :class:`WorkloadUnreadable` naming the
field. :func:`held_message` is the ``HeldByKueue`` condition's message (``sharing.api.placement_status``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from sharing.api.fields import as_list, as_map

GROUP: Final = "kueue.x-k8s.io"
VERSION: Final = "v1beta2"
"""The version gpupack reads (v0.17's storage version; its CRDs serve v1beta1 too)."""
WORKLOADS: Final = "workloads"
QUOTA_RESERVED: Final = "QuotaReserved"
ADMITTED: Final = "Admitted"
INADMISSIBLE: Final = "Inadmissible"
"""``QuotaReserved``'s reason when the pod's LocalQueue or ClusterQueue is missing or stopped."""

NEVER_MARKS: Final = ("> maximum capacity", "unavailable in ClusterQueue")
"""Kueue's words for a request no quota of the ClusterQueue can ever hold (module docstring)."""
WAITING_MARK: Final = "insufficient unused quota"
"""Kueue's words for a request that fits once other workloads leave."""

NEVER_EVENT: Final = "NeverAdmittedByKueue"
"""Reason of the Warning Event the controller writes once on a pod Kueue can never admit."""


class WorkloadUnreadable(ValueError):
    """A Workload without a field gpupack reads (the message names it and the Workload)."""


@dataclass(frozen=True)
class KueueVerdict:
    """What one Workload says about the pod that owns it."""

    workload: str
    """``namespace/name`` of the Workload."""
    pods: tuple[str, ...]
    """The ``uid`` of each pod among its owners (one for a plain pod)."""
    condition: str
    """The condition that speaks: ``QuotaReserved`` while not admitted, else ``Admitted``; empty
    when Kueue has written neither yet."""
    status: str = ""
    reason: str = ""
    message: str = ""

    @property
    def never(self) -> bool:
        """The pod can never be admitted while its queues stand as they are (:func:`never_admitted`)."""
        return self.condition == QUOTA_RESERVED and self.status == "False" and never_admitted(self.reason, self.message)


def never_admitted(reason: str, message: str) -> bool:
    """Whether Kueue's ``QuotaReserved=False`` (``reason``, ``message``) says the pod can never be
    admitted: its queue is missing or stopped (``Inadmissible``), or each reason names a request
    beyond the ClusterQueue's maximum capacity or a resource it does not cover."""
    if reason == INADMISSIBLE:
        return True
    return any(mark in message for mark in NEVER_MARKS) and WAITING_MARK not in message


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def read_workload(obj: Mapping[str, Any]) -> KueueVerdict:
    """The verdict of one raw Workload; :class:`WorkloadUnreadable` when it has no name, namespace
    or pod owner, or its ``status.conditions`` is not a list of conditions."""
    meta = as_map(obj.get("metadata"))
    name, namespace = _text(meta.get("name")), _text(meta.get("namespace"))
    if not name or not namespace:
        raise WorkloadUnreadable(f"Workload {namespace or '?'}/{name or '?'}: metadata.name and "
                                 "metadata.namespace must be strings")
    key = f"{namespace}/{name}"
    pods = tuple(_text(o.get("uid")) for o in map(as_map, as_list(meta.get("ownerReferences")))
                 if o.get("kind") == "Pod" and _text(o.get("uid")))
    if not pods:
        raise WorkloadUnreadable(f"Workload {key}: no ownerReference of kind Pod with a uid "
                                 "(not a plain pod's Workload)")
    raw = as_map(obj.get("status")).get("conditions", [])
    if not isinstance(raw, list) or not all(isinstance(c, Mapping) for c in raw):
        raise WorkloadUnreadable(f"Workload {key}: status.conditions must be a list of conditions")
    by_type = {_text(c.get("type")): c for c in raw}
    admitted = by_type.get(ADMITTED)
    if admitted is not None and admitted.get("status") == "True":
        speaking, condition = admitted, ADMITTED
    elif QUOTA_RESERVED in by_type:
        speaking, condition = by_type[QUOTA_RESERVED], QUOTA_RESERVED
    else:
        return KueueVerdict(key, pods, "")
    return KueueVerdict(key, pods, condition, _text(speaking.get("status")), _text(speaking.get("reason")),
                        _text(speaking.get("message")))


def verdicts_by_pod(workloads: Iterable[Mapping[str, Any]]) -> tuple[dict[str, KueueVerdict], tuple[str, ...]]:
    """Each pod's verdict by pod ``uid``, and why each Workload left out could not be read."""
    out: dict[str, KueueVerdict] = {}
    unreadable: list[str] = []
    for obj in workloads:
        try:
            verdict = read_workload(obj)
        except WorkloadUnreadable as exc:
            unreadable.append(str(exc))
            continue
        for uid in verdict.pods:
            out[uid] = verdict
    return out, tuple(unreadable)


def held_message(verdict: KueueVerdict | None, *, workloads_read: bool, waited_s: float,
                 no_workload_after_s: float) -> str:
    """The ``HeldByKueue`` message of a pod still at Kueue's admission gate.

    ``verdict``: its Workload's (None: none found). ``workloads_read``: the controller read Kueue's
    Workloads this cycle (False: the API is not served, or the read failed). ``waited_s``: the
    pod's age; a pod without a Workload after ``no_workload_after_s`` is said to have none (Kueue
    makes one within a second when it runs)."""
    gate = "gpupack plans it once Kueue lifts its gate kueue.x-k8s.io/admission"
    if verdict is None:
        if not workloads_read:
            return (f"held by Kueue: Kueue's Workloads ({GROUP}/{VERSION}) cannot be read: is Kueue installed "
                    f"and running? {gate}")
        if waited_s >= no_workload_after_s:
            return f"held by Kueue: no Kueue Workload for this pod after {int(waited_s)}s: is Kueue running? {gate}"
        return f"held by Kueue: its Workload is not created yet; {gate}"
    said = f"{verdict.condition}={verdict.status} ({verdict.reason})" if verdict.condition else "no condition yet"
    words = f": {verdict.message}" if verdict.message else ""
    if verdict.never:
        return (f"never admitted by Kueue as its queues stand (fix the ClusterQueue's quota or the pod's "
                f"request): {said}{words}")
    return f"held by Kueue: {said}{words}; {gate}"


__all__ = ["ADMITTED", "GROUP", "INADMISSIBLE", "KueueVerdict", "NEVER_EVENT", "QUOTA_RESERVED", "VERSION",
           "WORKLOADS", "WorkloadUnreadable", "held_message", "never_admitted", "read_workload",
           "verdicts_by_pod"]
