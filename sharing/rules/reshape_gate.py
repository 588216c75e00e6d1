"""May a node's GPUs be reshaped or switched now: the one gate every driver asks.

A change of a GPU's MIG layout, or of a node's sharing mode, starts only where the
SharingPolicy bounds of the node (:class:`sharing.rules.node_policy.NodePolicy`,
merged once for everyone) allow it *now*. Every driver asks :func:`reshape_gate`:
the controller's planner (MIG layouts, static layouts, sharing switches), its view of
what a DRA node offers (``controller.planning.dramig``), the node agent before it
applies its GPUNode spec (``node.base.reshape_rules``) and the DRA advertiser before it
offers new MIG placements (``node.advertising.dra``). Each passes what it knows;
a rule whose input a caller does not pass is that caller's to judge (the agent
judges idleness per MIG instance, with its own clocks, ``node.base.idle_tracking``).

The rules, in order; the first that refuses is the answer (:data:`GateReason`):

1. ``no-policy``: no SharingPolicy selects the node. gpupack changes GPUs only where
   an admin opted in. The agent applying its spec passes ``needs_policy=False``: the
   spec is the decision there, and only a policy restricts it, so the answer is
   "allowed" and none of the rules below applies.
2. ``static-layout``: the policy pins a static layout, and the change is one gpupack
   would choose itself (``dynamic_layout``: a layout for demand, a new DRA placement).
3. ``frozen``: a selecting policy says ``reshaping.maxConcurrent: 0`` (the merged bound is 0).
4. ``outside-window``: a policy that lists reshaping windows has none open at ``now``
   (each window is read by ``sharing.rules.windows``; all such policies must agree).
5. ``max-concurrent``: ``in_flight`` changes of the policy's group (being applied, or
   planned this cycle) already reach ``maxConcurrent``. Only the controller counts them;
   the agent applies one GPU at a time and trusts the plan.
6. ``not-idle``: a GPU the change touches is in use, or has been idle for less than
   ``reshaping.idleSeconds`` (:func:`idle_long_enough`, the one reading of "idle long
   enough", which the agent's per-instance clocks use too).

The answer's :attr:`ReshapeGate.message` is what users see (GPUNode conditions, Events,
the ``ResourceSlicesPublished`` message): it names the policy and the bound. It is
made only when read, because the planner asks per node and per pod and reads none.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sharing.rules.node_policy import NodePolicy, PolicyWindows

GateReason = Literal["no-policy", "static-layout", "frozen", "outside-window", "max-concurrent", "not-idle"]
"""Why a change may not start now (the module docstring's rules, in the order they are checked)."""


@dataclass(frozen=True, slots=True)
class ReshapeGate:
    """The gate's answer: allowed (``reason`` None), or the first rule that refuses and what it names."""

    reason: GateReason | None = None
    policy: NodePolicy | None = None
    """The merged policy that refuses (None for ``no-policy``)."""
    closed: PolicyWindows | None = None
    """``outside-window``: the policy none of whose windows is open."""
    in_flight: int = 0
    """``max-concurrent``: the changes counted against the bound."""
    idle_for: float | None = None
    """``not-idle``: seconds the first GPU found short has been idle; None: it is in use."""

    @property
    def allowed(self) -> bool:
        return self.reason is None

    @property
    def message(self) -> str:
        """Why not, in the words users see; empty when allowed."""
        policy = self.policy
        if self.reason is None:
            return ""
        if self.reason == "no-policy" or policy is None:
            return "no SharingPolicy selects this node"
        names = ", ".join(policy.names)
        if self.reason == "static-layout":
            return f"SharingPolicy {names} pins a static layout"
        if self.reason == "frozen":
            return f"layouts frozen by SharingPolicy {', '.join(policy.frozen_by or policy.names)} (reshaping.maxConcurrent: 0)"
        if self.reason == "outside-window" and self.closed is not None:
            return f"outside the reshaping windows of SharingPolicy {self.closed.policy} ({self.closed.describe()} UTC)"
        if self.reason == "max-concurrent":
            return (f"{self.in_flight} change(s) in flight reach reshaping.maxConcurrent {policy.max_concurrent} "
                    f"of SharingPolicy {names}")
        held = "a GPU is in use" if self.idle_for is None else f"a GPU has been idle for {self.idle_for:g}s"
        return f"{held}; SharingPolicy {names} asks {policy.idle_seconds}s idle (reshaping.idleSeconds)"


ALLOWED = ReshapeGate()


def idle_long_enough(idle_for: float | None, idle_seconds: float) -> bool:
    """Whether something idle for ``idle_for`` seconds (None: in use now) may be changed under
    an idle time of ``idle_seconds``: idle for at least that long (``idleSeconds: 0`` still
    needs it idle)."""
    return idle_for is not None and idle_for >= idle_seconds


def reshape_gate(policy: NodePolicy | None, now: datetime, *, needs_policy: bool = True, dynamic_layout: bool = False,
                 in_flight: int | None = None, idle_for: Iterable[float | None] = ()) -> ReshapeGate:
    """Whether a change may start on a node whose merged policy is ``policy`` at ``now`` (UTC).

    ``needs_policy``: a node no policy selects is refused (False: the agent applying its
    spec). ``dynamic_layout``: the change is a layout gpupack chooses, which a static
    layout forbids. ``in_flight``: the changes of the policy's group being applied or
    planned (None: not counted here). ``idle_for``: for each GPU the change touches, the
    seconds it has been idle, None when in use (empty: idleness is not judged here).
    """
    if policy is None:
        return ReshapeGate("no-policy") if needs_policy else ALLOWED
    if dynamic_layout and policy.static_layout is not None:
        return ReshapeGate("static-layout", policy)
    if policy.max_concurrent <= 0:
        return ReshapeGate("frozen", policy)
    closed = policy.closed_by(now)
    if closed is not None:
        return ReshapeGate("outside-window", policy, closed=closed)
    if in_flight is not None and in_flight >= policy.max_concurrent:
        return ReshapeGate("max-concurrent", policy, in_flight=in_flight)
    for seconds in idle_for:
        if not idle_long_enough(seconds, policy.idle_seconds):
            return ReshapeGate("not-idle", policy, idle_for=seconds)
    return ALLOWED
