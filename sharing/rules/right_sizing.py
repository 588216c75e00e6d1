"""Which right-sizing mode applies to a namespace: the one rule the webhook and the controller share.

Right-sizing is opt-in (issue 35), per namespace or per SharingPolicy:

* a namespace labelled ``gpupack.io/right-sizing`` with ``Off``, ``Initial`` or ``Recreate`` gets
  that mode, whatever the policies say (an owner may opt in, or out, on their own);
* otherwise each SharingPolicy with a ``rightSizing`` section applies to the namespaces its
  ``namespaces`` rules cover (no rules: every namespace), and where several apply the one that
  acts least wins (``Off`` < ``Initial`` < ``Recreate``): a policy cannot widen what another
  keeps cautious;
* no label and no such policy: ``Off``.

The bounds (compute over-commit, evictions per hour) are the strictest of the policies that have
a ``rightSizing`` section and cover the namespace; with none, the defaults (no over-commit, one
eviction per workload per hour). A label with another value is ignored (mode from the policies)
and named in ``RightSizing.ignored_label``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sharing.api.crd import RIGHT_SIZING_MODES, RightSizingMode, RightSizingPolicy, SharingPolicySpec
from sharing.api.keys import RIGHT_SIZING_LABEL


@dataclass(frozen=True)
class RightSizing:
    """The right-sizing in force for one namespace."""

    mode: RightSizingMode = "Off"
    compute_overcommit: float = 1.0
    max_evictions_per_hour: int = 1
    source: str = "default"
    """Where the mode came from: ``namespace label`` or the policies' names."""
    ignored_label: str | None = None

    @property
    def sizes_new_pods(self) -> bool:
        return self.mode in ("Initial", "Recreate")

    @property
    def evicts(self) -> bool:
        return self.mode == "Recreate" and self.max_evictions_per_hour > 0


def _covers(spec: SharingPolicySpec, namespace: str, labels: Mapping[str, str] | None) -> bool:
    return not spec.namespaces or any(rule.matches(namespace, labels) for rule in spec.namespaces)


def right_sizing_for(policies: Sequence[tuple[str, SharingPolicySpec]], namespace: str,
                     labels: Mapping[str, str] | None) -> RightSizing:
    """The right-sizing for ``namespace`` (``labels``: its labels, None when unknown), from the
    valid SharingPolicies by name (module docstring)."""
    applying: list[tuple[str, RightSizingPolicy]] = [
        (name, spec.right_sizing) for name, spec in policies
        if spec.right_sizing is not None and _covers(spec, namespace, labels)]
    overcommit = min((p.compute_overcommit for _, p in applying), default=1.0)
    evictions = min((p.max_evictions_per_hour for _, p in applying), default=RightSizingPolicy().max_evictions_per_hour)
    label = (labels or {}).get(RIGHT_SIZING_LABEL)
    for mode in RIGHT_SIZING_MODES:
        if label == mode:
            return RightSizing(mode, overcommit, evictions, "namespace label")
    ignored = None if label is None else f"{RIGHT_SIZING_LABEL}={label!r} is not one of {', '.join(RIGHT_SIZING_MODES)}"
    if not applying:
        return RightSizing(source="default", ignored_label=ignored)
    mode = min((p.mode for _, p in applying), key=RIGHT_SIZING_MODES.index)
    return RightSizing(mode, overcommit, evictions, ",".join(name for name, _ in applying), ignored)


__all__ = ["RightSizing", "right_sizing_for"]
