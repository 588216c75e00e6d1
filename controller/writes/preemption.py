"""What the controller writes to preempt: the preemptor's pin and record, the victims' condition and Event.

Pure builders; :mod:`controller.reconcile` sends them, in this order, for a
:class:`controller.planning.preemption.Preemption`:

1. the preemptor: one guarded JSON patch (``test`` on its scheduling gates, as a release is
   guarded) that pins it to the node (:func:`controller.writes.patches.pin_ops`; the gate stays)
   and records its victims' uids in ``gpupack.io/preempting`` (``sharing.api.preempting``). If it
   fails, nothing is deleted. A preemptor that is not gpupack's (a pod asking ``nvidia.com/gpu``
   that kube-scheduler left Unschedulable) is not pinned: its record also names the node
   (:func:`plain_preemptor_ops`, guarded by its ``resourceVersion``);
2. each victim: the ``DisruptionTarget`` condition kube-scheduler's preemption writes, with
   gpupack's reason (``PreemptionByGpupack``) and a message naming the preemptor
   (:func:`disruption_patch`), then a ``Preempted`` Event (:func:`event_message`), then the
   deletion, preconditioned on the victim's uid and with no grace period of its own, so the
   pod's ``terminationGracePeriodSeconds`` applies, as kube-scheduler's deletion does.

The record comes first so that a controller stopped halfway finds it and finishes (the
planner's :func:`controller.planning.preemption.resume`), and never chooses other victims for
the same pod while these still exist.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from controller.planning.preemption import Preemption
from controller.writes.patches import Op, pin_ops
from kube.times import format_time
from sharing.api.fields import as_map as _map
from sharing.api.keys import PREEMPTING_ANNOTATION, PREEMPTION_REASON
from sharing.api.preempting import PreemptingRecord, preempting_text

DISRUPTION_TARGET = "DisruptionTarget"
"""The pod condition Kubernetes sets on a pod about to be deleted by a disruption (preemption among them)."""
PREEMPTED_EVENT = "Preempted"
"""The Event reason kube-scheduler gives a pod it preempts; gpupack's says the same on its victims."""

_ANNOTATION_PATH = "/metadata/annotations/" + PREEMPTING_ANNOTATION.replace("~", "~0").replace("/", "~1")


def preemptor_ops(pod: Mapping[str, Any], node: str, victims: Sequence[str], *, pinned: bool) -> list[Op]:
    """One guarded JSON patch: pin ``pod`` to ``node`` (unless already ``pinned`` there), gate kept,
    and record ``victims`` (uids). ValueError when the pod is no longer gated by gpupack."""
    ops = pin_ops(pod, node)  # its first op tests the gates, and it refuses a pod gpupack no longer gates
    if pinned:
        ops = ops[:1]
    return ops + _record_ops(pod, PreemptingRecord(tuple(victims)))


def plain_preemptor_ops(pod: Mapping[str, Any], node: str, victims: Sequence[str]) -> list[Op]:
    """One guarded JSON patch for a preemptor that is not gpupack's (``Preemption.plain``): its spec
    cannot change (no pin), so the record names ``node`` beside ``victims``. Guarded by a ``test`` of
    the ``resourceVersion`` the plan saw: if kube-scheduler bound or nominated the pod since, the patch
    fails and nothing is deleted. ValueError when the object has no resourceVersion."""
    version = _map(pod.get("metadata")).get("resourceVersion")
    if not isinstance(version, str) or not version:
        raise ValueError("the pod has no metadata.resourceVersion to guard the preemption's record")
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": version},
            *_record_ops(pod, PreemptingRecord(tuple(victims), node))]


def _record_ops(pod: Mapping[str, Any], record: PreemptingRecord) -> list[Op]:
    ops: list[Op] = []
    if not isinstance(_map(pod.get("metadata")).get("annotations"), Mapping):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    ops.append({"op": "add", "path": _ANNOTATION_PATH, "value": preempting_text(record)})
    return ops


def disruption_message(preemption: Preemption) -> str:
    return (f"gpupack preempted this pod to place {preemption.preemptor}, of higher priority, on node "
            f"{preemption.node}")


def disruption_patch(preemption: Preemption, now: datetime) -> dict[str, Any]:
    """The strategic-merge status patch adding the ``DisruptionTarget`` condition (conditions merge by type)."""
    return {"status": {"conditions": [{
        "type": DISRUPTION_TARGET, "status": "True", "reason": PREEMPTION_REASON,
        "message": disruption_message(preemption), "lastTransitionTime": format_time(now),
    }]}}


def event_message(preemption: Preemption, priority: int) -> str:
    """The ``Preempted`` Event's message on a victim of ``priority``."""
    return (f"Preempted by gpupack for pod {preemption.preemptor} on node {preemption.node} "
            f"(this pod's priority {priority} is lower); deleted with its grace period")


__all__ = ["DISRUPTION_TARGET", "PREEMPTED_EVENT", "disruption_patch", "event_message", "plain_preemptor_ops",
           "preemptor_ops"]
