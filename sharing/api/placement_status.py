"""The controller's word on a gated pod it has not placed: one pod condition, one reader, one writer.

A pod of gpupack's waits at the ``gpupack.io/capacity`` gate until the
controller's packing engine places it. kube-scheduler says nothing useful about
a gated pod (``PodScheduled=False, reason SchedulingGated``), so the controller
says why it waits, as a pod condition of its own type, :data:`PLACEMENT_CONDITION`:

========================  ======  =====================================================
reason                    status  meaning
========================  ======  =====================================================
``WaitingForCapacity``    False   capacity for the pod is being created (a node
                                  switching its sharing, a MIG layout being applied),
                                  or something else in the cluster is still changing:
                                  the pod may be placed in a later cycle without
                                  anything leaving
``NoCapacity``            False   the last cycle placed nothing for it, planned no
                                  change anywhere, and nothing was in flight: no
                                  capacity for it exists or is being created. It stays
                                  gated and is placed once a pod leaves, a policy
                                  lets a node change, or a GPU has been idle long
                                  enough (``idleSeconds``)
``HeldByKueue``           False   the pod still carries Kueue's admission gate
                                  (``kueue.x-k8s.io/admission``): its ClusterQueue has
                                  not admitted it, so the controller does not plan it
                                  (no reshape, no split) until Kueue lifts that gate
``Placed``                True    the controller released it (pinned to a node, gate
                                  lifted); written only over an earlier ``False``
========================  ======  =====================================================

``message`` is the planner's reason in words, for people; programs read
``reason``. ``lastProbeTime`` is the time of the controller cycle that judged
(``metav1.Time``, to the second); ``lastTransitionTime`` moves only when
``status`` changes. The controller writes the condition through the pod's
``status`` subresource (a strategic-merge patch keyed by condition type, so
kube-scheduler's own conditions stay as they are), and only when the reason
changes, or the message does and the caller says a new message is due (the
controller: at most once a minute per pod), so a pod that waits costs one
write, not one per cycle, even while the planner's words about it change.

A trace replay (``gpupack replay``) reads ``NoCapacity`` as "this pod cannot be
placed in the current cluster": in the protocol nothing ever leaves, so nothing
would free capacity for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypedDict, get_args

from sharing.api.keys import PLACEMENT_CONDITION

PlacementReason = Literal["WaitingForCapacity", "NoCapacity", "HeldByKueue", "Placed"]
PLACEMENT_REASONS: Final[tuple[PlacementReason, ...]] = get_args(PlacementReason)
WAITING_FOR_CAPACITY: Final[PlacementReason] = "WaitingForCapacity"
NO_CAPACITY: Final[PlacementReason] = "NoCapacity"
HELD_BY_KUEUE: Final[PlacementReason] = "HeldByKueue"
PLACED: Final[PlacementReason] = "Placed"

MESSAGE_LIMIT: Final = 1024
"""Longest message written (the planner's reasons are a line; a condition message may be 32 KiB)."""


class PodCondition(TypedDict):
    """A pod condition as the API holds it (``core/v1`` ``PodCondition``)."""

    type: str
    status: Literal["True", "False"]
    reason: str
    message: str
    lastProbeTime: str
    lastTransitionTime: str


@dataclass(frozen=True)
class PlacementStatus:
    """What :data:`PLACEMENT_CONDITION` says about a pod."""

    reason: PlacementReason
    message: str
    probed_at: str | None
    """The controller cycle that judged: ``lastProbeTime`` as written (RFC 3339, to the second;
    ``kube.times.parse_time`` reads it, outside this pure layer); None if missing."""
    since: str | None
    """``lastTransitionTime`` as written."""

    @property
    def unplaceable(self) -> bool:
        """No capacity exists for the pod and none is being created (reason ``NoCapacity``)."""
        return self.reason == NO_CAPACITY

    @property
    def placed(self) -> bool:
        return self.reason == PLACED


def _conditions(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    status = pod.get("status")
    raw = status.get("conditions") if isinstance(status, Mapping) else None
    return [c for c in raw if isinstance(c, Mapping)] if isinstance(raw, list) else []


def read_placement(pod: Mapping[str, Any]) -> PlacementStatus | None:
    """The controller's placement condition of ``pod`` (a raw Pod object); None when it has none,
    or one whose reason is not one of :data:`PLACEMENT_REASONS` (written by something else)."""
    for cond in _conditions(pod):
        if cond.get("type") != PLACEMENT_CONDITION:
            continue
        reason = cond.get("reason")
        if reason not in PLACEMENT_REASONS:
            return None
        expected = "True" if reason == PLACED else "False"
        if cond.get("status") != expected:
            return None
        message = cond.get("message")
        return PlacementStatus(
            reason=reason,
            message=message if isinstance(message, str) else "",
            probed_at=_text(cond.get("lastProbeTime")),
            since=_text(cond.get("lastTransitionTime")),
        )
    return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def placement_condition(reason: PlacementReason, message: str, now: str,
                        previous: PlacementStatus | None = None) -> PodCondition:
    """The condition to write for ``reason``; ``lastTransitionTime`` kept from ``previous`` when
    the status (True/False) is the same. ValueError for a reason not in :data:`PLACEMENT_REASONS`."""
    if reason not in PLACEMENT_REASONS:
        raise ValueError(f"placement reason {reason!r} is not one of {', '.join(PLACEMENT_REASONS)}")
    status: Literal["True", "False"] = "True" if reason == PLACED else "False"
    same_status = previous is not None and previous.placed == (reason == PLACED)
    since = previous.since if same_status and previous is not None and previous.since is not None else now
    return PodCondition(
        type=PLACEMENT_CONDITION, status=status, reason=reason, message=message[:MESSAGE_LIMIT],
        lastProbeTime=now, lastTransitionTime=since,
    )


def placement_patch(pod: Mapping[str, Any], reason: PlacementReason, message: str,
                    now: str, *, new_message_due: bool = True) -> dict[str, Any] | None:
    """The strategic-merge patch of ``pod``'s ``status`` subresource that records ``reason``, or None
    when the pod already says that (same reason, and the same message or ``new_message_due``
    False: the caller rate-limits message-only changes), or when it would record ``Placed`` on a
    pod that never had a placement condition (nothing to correct)."""
    previous = read_placement(pod)
    if previous is None and reason == PLACED:
        return None
    if previous is not None and previous.reason == reason and (
            previous.message == message[:MESSAGE_LIMIT] or not new_message_due):
        return None
    return {"status": {"conditions": [dict(placement_condition(reason, message, now, previous))]}}
