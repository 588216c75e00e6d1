"""The SharingPolicy rules the agent enforces itself: idle time, frozen layouts, reshaping windows.

The controller plans within the policy, but the agent is the last line before
NVML, so it checks again (a hand-edited ``GPUNode`` spec must not reshape a GPU
outside its window either). Which policies apply and how several merge is
``sharing.rules.node_policy``'s one reading, the same the controller plans with: the
longest idle time, frozen if any says ``maxConcurrent: 0``, and a moment is
inside the windows only if every matching policy that lists windows has one
open. Active reconfigurations are always finished: a window closing mid-way
must not leave a GPU half-reshaped.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sharing.api.crd import read_policies
from sharing.rules.node_policy import NodePolicy, policy_for_node


@dataclass(frozen=True)
class ReshapeRules:
    idle_seconds: float
    policy: NodePolicy | None = None
    """The merged policies selecting this node; None: no policy restricts it."""
    problems: tuple[str, ...] = ()

    @property
    def sources(self) -> tuple[str, ...]:
        return self.policy.names if self.policy is not None else ()

    @property
    def frozen_by(self) -> tuple[str, ...]:
        return self.policy.frozen_by if self.policy is not None else ()

    def may_start(self, now: float) -> tuple[bool, str]:
        """Whether a new reshape may start at ``now`` (epoch seconds), and if not, why."""
        if self.frozen_by:
            return False, f"layouts frozen by SharingPolicy {', '.join(self.frozen_by)} (reshaping.maxConcurrent: 0)"
        closed = self.policy.closed_by(dt.datetime.fromtimestamp(now, dt.timezone.utc)) if self.policy else None
        if closed is not None:
            return False, f"outside the reshaping windows of SharingPolicy {closed.policy} ({closed.describe()} UTC)"
        return True, ""


def reshape_rules(node_labels: Mapping[str, str], policies: Iterable[Mapping[str, Any]], default_idle: float) -> ReshapeRules:
    """The rules for a node with ``node_labels``; ``default_idle`` applies when no policy selects it."""
    readings = read_policies(policies)
    problems = tuple(f"SharingPolicy {p.name} ignored: {p.problem}" for p in readings if p.spec is None)
    merged = policy_for_node(((p.name, p.spec) for p in readings if p.spec is not None), node_labels, None)
    idle = float(merged.idle_seconds) if merged is not None else float(default_idle)
    return ReshapeRules(idle, merged, problems)
