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

Compute over-commit is applied by one rule, :func:`accounted_milli`: a right-sized container carries
its *predicted* milli (the recommendation, a duty cycle) and is *accounted* ``ceil(predicted /
compute_overcommit)`` milli wherever placement counts compute (the device plugin's replicas, a DRA
share's capacity, the packing engine). The sums those places already enforce (at most 1000 accounted
milli per GPU) then bound the predicted use of a GPU's right-sized shares by ``1000 x
compute_overcommit``; memory is never over-committed. Only predicted use is over-committed: a pod
that was not right-sized is accounted what it asked, and a pod predicted to use a whole GPU is
accounted all of it, over-commit or not, as the simulator's share rule has it
(``sharing.simulator.usage_replay``; docs/usage.md measured letting such pods share at 0.70 % of
H200 GPU-minutes saturated with 1.5, 1.58 % with 2.0, against a target of 0.1 %).
"""

from __future__ import annotations

import math
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

    def accounted_milli(self, predicted_milli: int) -> int:
        """What placement counts for a container right-sized to ``predicted_milli`` here (:func:`accounted_milli`)."""
        return accounted_milli(predicted_milli, self.compute_overcommit)


def accounted_milli(predicted_milli: int, compute_overcommit: float) -> int:
    """The compute milli placement counts for a share predicted to use ``predicted_milli`` (1..1000),
    where compute may be over-committed by ``compute_overcommit`` (at least 1.0; 1.0: none): ``ceil(
    predicted / compute_overcommit)``, at least 1; all 1000 for a share predicted to use a whole GPU
    (module docstring). Rounded up, so that the accounted shares of a GPU summing to at most 1000
    bound their predicted use by ``1000 x compute_overcommit``."""
    if not 1 <= predicted_milli <= 1000:
        raise ValueError(f"predicted milli must be in 1..1000, got {predicted_milli}")
    if not compute_overcommit >= 1.0:  # also refuses NaN
        raise ValueError(f"compute_overcommit must be at least 1.0, got {compute_overcommit}")
    if compute_overcommit == 1.0 or predicted_milli == 1000:
        return predicted_milli
    # A tiny tolerance keeps 600 / 1.5 at 400, not 401 from the float's last bit.
    return max(1, math.ceil(predicted_milli / compute_overcommit - 1e-9))


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


__all__ = ["RightSizing", "accounted_milli", "right_sizing_for"]
