"""Why gated pods wait, as the pod status the controller writes (``sharing.api.placement_status``).

Pure: a cycle's :class:`~controller.planning.planner.Plan`, its snapshot, the raw pod
objects it read and the time in; the status patches to write out. One reading
of the planner's outcome, no parsing of its prose:

* a gated pod the plan leaves waiting is ``NoCapacity`` when the cycle is
  **quiet**: it plans no layout or sharing change anywhere, and every node has
  converged (its agent has applied the last spec: no GPU reshaping, sharing
  status equal to spec). Nothing is being created, so nothing this controller
  does will place the pod until something in the cluster changes;
* otherwise ``WaitingForCapacity``: a change or a preemption planned now or still in flight, or
  a pod whose layout search was left to the next cycle (``Wait.deferred``), may
  give it room (the planner does not say which change is whose, and need not:
  once everything is quiet the verdict is exact); said only of a pod at least
  :data:`WAITING_SAID_AFTER_SECONDS` old, as most pods waiting for capacity
  being created get it within seconds;
* a gated pod that still carries Kueue's admission gate (the planner's ``Wait.held``) is
  ``HeldByKueue``: the planner plans nothing for it, so the verdict on capacity is not its; the
  message carries Kueue's own words (its Workload's condition, ``sharing.api.kueue_workload``), and
  one saying Kueue can never admit the pod (``Wait.never``) is written at once, not after
  :data:`MESSAGE_REFRESH_SECONDS`;
* a released pod that carries a ``False`` condition gets ``Placed``; one
  released in the cycle that first saw it gets nothing (no write).

DRA pool pods are judged the same way from ``controller.planning.draplan``'s outcome
(its waiting pods, and those refused because another's claim holds their
claim's name), so a gated DRA pod says why it waits as every gated pod does
(issue 33, item 8); one released gets ``Placed`` once its release was written.
Pods kube-scheduler places (ungated: whole GPUs asked directly, and pods the
planner only reports Unschedulable) are left to kube-scheduler's own
``PodScheduled`` condition.
Nothing is written when the condition already gives the same reason and
message; a new message alone (the planner names another node being switched,
say) is written at most every :data:`MESSAGE_REFRESH_SECONDS`. With a backlog
of pods, messages that changed every cycle had the controller rewrite every
waiting pod's condition every cycle: a write per pod per cycle, which stretched
cycles to a minute in the fleet's steady-state run. A pod that waits costs one
write, and one a minute while its message changes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from controller.planning.draplan import DraPlan
from controller.planning.planner import Plan, Release
from controller.state.snapshot import Snapshot
from kube.times import format_time, parse_time
from sharing.api.placement_status import (
    HELD_BY_KUEUE, NO_CAPACITY, PLACED, WAITING_FOR_CAPACITY, PlacementStatus, placement_patch, read_placement,
)

WAITING_SAID_AFTER_SECONDS: Final = 10
"""A pod first gets ``WaitingForCapacity`` once it is this old: one released sooner gets no condition at
all (and so no ``Placed`` either), two writes saved per pod in a busy cluster. ``NoCapacity`` is said at
once: it is the verdict a user, and ``gpupack replay``, acts on."""

WAITING_WRITES_PER_CYCLE: Final = 100
"""At most this many ``WaitingForCapacity`` writes a cycle (the oldest waiting pods first; the rest in
later cycles). Under a backlog they competed with the releases for the API server's writes, and the
cycle waits for both; ``NoCapacity`` and ``Placed`` are never held back."""

MESSAGE_REFRESH_SECONDS: Final = 60
"""A waiting pod's condition is rewritten for a new message (same reason) at most this often."""


@dataclass(frozen=True)
class StatusPatch:
    """One strategic-merge patch of a pod's ``status`` subresource."""

    namespace: str
    name: str
    body: dict[str, Any]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def quiet(plan: Plan, snapshot: Snapshot) -> bool:
    """The cycle plans no change, judged every waiting pod, and nothing is in flight on any node
    (module docstring)."""
    if plan.layouts or plan.sharing or plan.preemptions or any(w.deferred or w.preempting for w in plan.waiting):
        return False  # a preemption frees a place: that is capacity coming too
    return all(
        n.converged and n.sharing == n.spec_sharing and n.replicas == n.spec_replicas for n in snapshot.nodes
    )


def placement_patches(plan: Plan, snapshot: Snapshot, pods: Mapping[str, Mapping[str, Any]],
                      now: datetime, dra: DraPlan | None = None,
                      dra_released: Collection[str] = ()) -> list[StatusPatch]:
    """The pod status patches for one cycle. ``pods``: the raw pod objects the cycle read, by
    ``namespace/name`` (pods missing there are skipped: deleted meanwhile). ``dra``: the DRA pool's
    plan, whose placements count as released only when named in ``dra_released`` (a placement whose
    claim could not be created leaves its pod gated)."""
    dra = dra or DraPlan()
    waits = (*plan.waiting, *dra.waiting, *dra.refused)
    releases = (*plan.releases, *(Release(p.pod, p.node, p.reason) for p in dra.placements if p.pod in dra_released))
    gated = {p.key: p for p in snapshot.pods if p.gated}
    reason = NO_CAPACITY if quiet(plan, snapshot) else WAITING_FOR_CAPACITY
    young = now - timedelta(seconds=WAITING_SAID_AFTER_SECONDS)
    said_waiting = 0
    out: list[StatusPatch] = []
    for wait in waits:
        obj = pods.get(wait.pod)
        waiting = gated.get(wait.pod)
        if waiting is None or obj is None:
            continue
        previous = read_placement(obj)
        # A pod Kueue holds is HeldByKueue whatever the cycle's verdict, and said like WaitingForCapacity
        # (not while young, within the per-cycle bound): a flood held by its quota must not cost a write each.
        said = HELD_BY_KUEUE if wait.held else reason
        if said != NO_CAPACITY and waiting.created > young and previous is None:
            continue  # capacity is being created, and most pods get it within seconds: nothing to say yet
        if said != NO_CAPACITY and said_waiting >= WAITING_WRITES_PER_CYCLE:
            continue  # the rest are said in later cycles, oldest first
        # Kueue's "never" is said at once, whatever was said before (one write: its words do not change).
        body = placement_patch(obj, said, wait.reason, format_time(now),
                               new_message_due=wait.never or _message_due(previous, now))
        if body is not None:
            out.append(_patch(wait.pod, body))
            said_waiting += said != NO_CAPACITY
    for release in releases:
        obj = pods.get(release.pod)
        if obj is None:
            continue
        body = placement_patch(obj, PLACED, f"released to {release.node}: {release.reason}", format_time(now))
        if body is not None:
            out.append(_patch(release.pod, body))
    return out


def _message_due(previous: PlacementStatus | None, now: datetime) -> bool:
    """Whether the pod's condition (``previous``) may be rewritten for a new message alone: its last
    write (the cycle that judged, ``lastProbeTime``) is :data:`MESSAGE_REFRESH_SECONDS` old, or unreadable."""
    probed = parse_time(previous.probed_at) if previous is not None and previous.probed_at else None
    return probed is None or now - probed >= timedelta(seconds=MESSAGE_REFRESH_SECONDS)


def _patch(key: str, body: dict[str, Any]) -> StatusPatch:
    namespace, name = key.split("/", 1)
    return StatusPatch(namespace, name, body)
