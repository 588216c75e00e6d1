"""Utilisation feedback: per shared node, how many MPS/time-slicing replicas to advertise.

A node sharing each GPU into ``r`` replicas promises every pod ``1/r`` of a
GPU. Pods often use far less than they ask, so a static ``r`` leaves GPUs
half idle; and sometimes more, so GPUs saturate. The loop measures, per node,
the busy time of its GPUs (the agents' ``utilization.gpuPercent``) and the pods
on them, estimates the load of one pod, and proposes the replica count that
keeps a GPU at the policy's ``targetUtilization``:

    per-pod load  l  = max over GPUs with pods of (busy % / pods on it)
    ideal count   r* = floor(target / l)

Hysteresis: when the hottest GPU is above ``target + band`` (saturation) ``r``
drops to at most ``r - 1`` (towards ``r*``); it rises (to ``r*``) only when the
hottest GPU is below ``target - band``, ``r* > r`` and replicas, not demand, are
the limit (some GPU has all its replicas taken). Either way by at most a factor
``max_step`` per decision, after ``cooldown`` since the last change, and within
the policy's ``[min, max]``; in between nothing changes. The measurement is the
busy percent averaged over the sampling window (the agent's report), not an
instantaneous sample, so a momentary burst does not move ``r``. A change affects only new pods: the device plugin
re-advertises, running pods keep their replica.

Right-sizing: a pod whose measured use stays far below its request gets a
recommendation (the operator writes it as an annotation, an Event and a metric).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class FeedbackSettings:
    band_percent: int = 10
    """Half-width of the dead band around the target, in utilisation points: wide
    enough that sampling noise of a few points never flips the count."""
    max_step: float = 2.0
    """A decision moves ``r`` by at most this factor, so one odd sample cannot
    multiply the density of a node."""
    cooldown_seconds: int = 300
    """Minimum time between two changes of one node: new pods must arrive (and be
    measured) before the next step is judged."""
    min_pods: int = 2
    """Pods that must be measured on a node before it is judged (one pod says little)."""


@dataclass(frozen=True)
class GpuLoad:
    """One shared GPU: its busy percent over the sampling window and the pods on it."""

    busy_percent: float
    pods: int


@dataclass(frozen=True)
class ReplicaDecision:
    current: int
    proposed: int
    reason: str

    @property
    def changed(self) -> bool:
        return self.proposed != self.current


def decide_replicas(
    current: int,
    loads: Sequence[GpuLoad],
    *,
    minimum: int,
    maximum: int,
    target: int,
    settings: FeedbackSettings = FeedbackSettings(),
    last_change: datetime | None = None,
    now: datetime | None = None,
) -> ReplicaDecision:
    """The replica count for one node (see the module docstring)."""
    bounded = min(max(current, minimum), maximum)
    if bounded != current:
        return ReplicaDecision(current, bounded, f"replicas {current} outside the policy bounds [{minimum}, {maximum}]")
    if last_change is not None and now is not None and (now - last_change).total_seconds() < settings.cooldown_seconds:
        return ReplicaDecision(current, current, "cooling down after the last change")
    busy = [g for g in loads if g.pods > 0]
    pods = sum(g.pods for g in busy)
    if pods < settings.min_pods:
        return ReplicaDecision(current, current, f"{pods} measured pod(s); need {settings.min_pods}")
    # The heaviest GPU's pods set the estimate: new pods may be as heavy as the
    # heaviest ones seen, and a GPU saturates on its own pods, not on the average.
    per_pod = max(g.busy_percent / g.pods for g in busy)
    ideal = math.floor(min(1000.0, target / per_pod)) if per_pod > 0 else maximum  # 1000: nothing measurable
    hottest = max(g.busy_percent for g in busy)
    mean = sum(g.busy_percent for g in busy) / len(busy)
    if hottest > target + settings.band_percent:
        lowest = max(minimum, math.ceil(current / settings.max_step))
        proposed = max(lowest, min(current - 1, ideal))
        why = f"saturating: a GPU at {hottest:.0f}% > {target}+{settings.band_percent}%"
    elif hottest < target - settings.band_percent and ideal > current and _replicas_limit(busy, current):
        proposed = min(ideal, maximum, math.floor(current * settings.max_step))
        why = f"headroom: hottest GPU at {hottest:.0f}% < {target}-{settings.band_percent}% with every replica taken"
    else:
        return ReplicaDecision(current, current, f"within the band ({mean:.0f}% mean, {hottest:.0f}% max)")
    proposed = min(max(proposed, minimum), maximum)
    return ReplicaDecision(current, proposed, f"{why}; {per_pod:.1f}% per pod -> ideal {ideal}")


def _replicas_limit(busy: Sequence[GpuLoad], current: int) -> bool:
    """Raising ``r`` helps only where replicas, not demand, limit the GPUs: some GPU is full."""
    return any(g.pods >= current for g in busy)


@dataclass(frozen=True)
class Recommendation:
    requested_milli: int
    recommended_milli: int
    reason: str


def right_size(
    requested_milli: int, used_milli: Sequence[float], *, headroom: float = 0.3, threshold: float = 0.5, quantum: int = 50
) -> Recommendation | None:
    """A smaller request for a pod whose peak measured use (+ headroom) is below ``threshold`` of its request.

    ``used_milli``: the pod's measured compute use in milli over the window. The
    recommendation is the peak plus ``headroom``, rounded up to ``quantum`` milli;
    None when the pod uses enough of what it asked, or nothing was measured.
    """
    if not used_milli or requested_milli <= 0:
        return None
    peak = max(used_milli)
    wanted = min(requested_milli, max(quantum, math.ceil(peak * (1 + headroom) / quantum) * quantum))
    if wanted > threshold * requested_milli:
        return None
    return Recommendation(
        requested_milli,
        wanted,
        f"peak use {peak:.0f} milli of {requested_milli} requested; {wanted} covers it with {headroom:.0%} headroom",
    )
