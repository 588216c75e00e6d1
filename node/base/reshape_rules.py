"""The SharingPolicies that select this node, as the agent reads them each tick, and its gate.

The controller plans within the policy, but the agent is the last line before
NVML, so it asks again (a hand-edited ``GPUNode`` spec must not reshape a GPU
outside its window either). Which policies apply and how several merge is
``sharing.rules.node_policy``'s one reading, the same the controller plans with;
whether a change may start now is ``sharing.rules.reshape_gate``'s, the same the
controller's planner asks. What is the agent's own here: reading the raw objects
(a policy it cannot read is reported, not fatal), its default idle time where no
policy selects the node, and the clock it asks with (epoch seconds).

Applying the spec (:meth:`ReshapeRules.may_start`) needs no policy: the spec is the
decision, and only a selecting policy restricts it (frozen, outside its windows).
Offering new MIG placements on a DRA node (:meth:`ReshapeRules.gate` with
``needs_policy``, ``node.advertising.dra``) is gpupack's own choice and needs one.
Active reconfigurations are always finished: a window closing mid-way must not
leave a GPU half-reshaped.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sharing.api.crd import read_policies
from sharing.rules.node_policy import NodePolicy, policy_for_node
from sharing.rules.reshape_gate import ReshapeGate, reshape_gate


@dataclass(frozen=True)
class ReshapeRules:
    idle_seconds: float
    """The policy's idle time, or the agent's default where no policy selects the node."""
    policy: NodePolicy | None = None
    """The merged policies selecting this node; None: no policy restricts it."""
    problems: tuple[str, ...] = ()

    @property
    def sources(self) -> tuple[str, ...]:
        return self.policy.names if self.policy is not None else ()

    @property
    def frozen_by(self) -> tuple[str, ...]:
        return self.policy.frozen_by if self.policy is not None else ()

    def gate(self, now: float, *, needs_policy: bool, dynamic_layout: bool = False) -> ReshapeGate:
        """``sharing.rules.reshape_gate`` at ``now`` (epoch seconds) for this node's policy."""
        moment = dt.datetime.fromtimestamp(now, dt.timezone.utc)
        return reshape_gate(self.policy, moment, needs_policy=needs_policy, dynamic_layout=dynamic_layout)

    def may_start(self, now: float) -> tuple[bool, str]:
        """Whether a reshape the spec asks for may start at ``now`` (epoch seconds), and if not, why."""
        answer = self.gate(now, needs_policy=False)
        return answer.allowed, answer.message


def reshape_rules(node_labels: Mapping[str, str], policies: Iterable[Mapping[str, Any]], default_idle: float) -> ReshapeRules:
    """The rules for a node with ``node_labels``; ``default_idle`` applies when no policy selects it."""
    readings = read_policies(policies)
    problems = tuple(f"SharingPolicy {p.name} ignored: {p.problem}" for p in readings if p.spec is None)
    merged = policy_for_node(((p.name, p.spec) for p in readings if p.spec is not None), node_labels, None)
    idle = float(merged.idle_seconds) if merged is not None else float(default_idle)
    return ReshapeRules(idle, merged, problems)
