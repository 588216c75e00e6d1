"""What the controller made of each SharingPolicy: its ``status`` (pure).

For every policy: how many GPU nodes its selector matches (the same reading of
the selector the planner uses, ``SharingPolicySpec.node_selector``), whether it
is applied or refused as invalid, whether another policy selects some of the
same nodes (then the strictest bound of each applies there:
``sharing.rules.node_policy.merge``), and since when the current generation is
applied. ``kubectl get sharingpolicies`` shows these as its columns.

The controller writes a policy's status only when something other than the
times changed (:func:`needs_write`), so a steady cluster costs no writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kube.conditions import Cond, merge_conditions
from kube.times import format_time
from sharing.api.crd import SharingPolicyStatus, read_policies
from sharing.api.fields import as_list as _list

READY = "Ready"
OVERLAPPING = "Overlapping"


@dataclass(frozen=True)
class PolicyReport:
    """One policy as the controller sees it this cycle."""

    name: str
    generation: int
    matched: tuple[str, ...]
    """GPU nodes the selector matches (empty for an invalid spec)."""
    shared_with: tuple[str, ...] = ()
    """Other policies selecting at least one of the same nodes."""
    overlap: int = 0
    """How many of ``matched`` another policy selects too."""
    invalid: str | None = None
    """Why the spec does not validate (the controller ignores such a policy)."""


def policy_reports(policies: Iterable[Mapping[str, Any]], nodes: Iterable[tuple[str, Mapping[str, str]]]) -> list[PolicyReport]:
    """A report per named policy object, against ``nodes`` (GPU node name, Node labels)."""
    node_list = list(nodes)
    entries = read_policies(policies)
    selected = {
        p.name: tuple(sorted(n for n, labels in node_list if p.spec.node_selector.matches(labels)))
        for p in entries if p.spec is not None
    }
    out = []
    for entry in entries:
        mine = selected.get(entry.name, ())
        others = {other: set(nodes_) & set(mine) for other, nodes_ in selected.items() if other != entry.name}
        shared = tuple(sorted(o for o, common in others.items() if common))
        overlap = len(set().union(*others.values()))  # each already within mine
        out.append(PolicyReport(entry.name, entry.generation, mine, shared, overlap, entry.problem))
    return out


def status_for(report: PolicyReport, previous: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The wire form of the policy's status for ``report`` (validated against the API model)."""
    if report.invalid is not None:
        ready = Cond(READY, "False", "InvalidSpec", f"ignored by the controller: {report.invalid}")
    elif report.matched:
        ready = Cond(READY, "True", "Applied", f"applied to {len(report.matched)} GPU node(s)")
    else:
        ready = Cond(READY, "True", "NoNodesSelected", "applied, but its nodeSelector matches no GPU node")
    if report.shared_with:
        overlapping = Cond(OVERLAPPING, "True", "SharesNodes",
                           f"{report.overlap} of its node(s) also selected by {', '.join(report.shared_with)}; "
                           "there the strictest bound of each policy applies")
    else:
        overlapping = Cond(OVERLAPPING, "False", "Exclusive", "no other policy selects its nodes")
    applied = previous.get("appliedTime")
    if report.invalid is not None:
        applied = None  # not applied at all
    elif previous.get("observedGeneration") != report.generation or not isinstance(applied, str):
        applied = format_time(now)
    raw: dict[str, Any] = {
        "observedGeneration": report.generation,
        "matchedNodes": len(report.matched),
        "conditions": merge_conditions(_list(previous.get("conditions")), [ready, overlapping], report.generation, now),
    }
    if applied is not None:
        raw["appliedTime"] = applied
    return SharingPolicyStatus.model_validate(raw).model_dump(mode="json", by_alias=True, exclude_none=True)


def needs_write(previous: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether ``wanted`` says anything ``previous`` does not (times aside)."""
    return _without_times(previous) != _without_times(wanted)


def _without_times(status: Mapping[str, Any]) -> dict[str, Any]:
    conditions = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in _list(status.get("conditions")) if isinstance(c, Mapping)
    ]
    return {**{k: v for k, v in status.items() if k not in ("appliedTime", "conditions")}, "conditions": conditions}
