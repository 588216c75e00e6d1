"""The SharingPolicy bounds that apply to one node: the one interpreter of selection and merging.

A node selected by no policy is never reshaped: gpupack changes GPUs only where
an admin opted in. A node selected by several policies gets the strictest of
each bound, so adding a policy can only restrict what gpupack does, never widen
it:

- allowed profiles: the intersection; a static layout: the first pinning policy's
  (by name);
- reshaping windows: a reshape may start only when **every** policy that lists
  windows has one of them open (policies whose windows never overlap therefore
  freeze reshaping on that node, which :attr:`NodePolicy.windows` makes visible
  per policy); each window is read by :mod:`sharing.rules.windows` (UTC, crossing
  midnight, ``start == end`` is the whole day);
- ``maxConcurrent``: the smallest; 0 from any policy freezes the node's layouts
  (:attr:`NodePolicy.frozen_by` names who froze them);
- idle seconds: the longest; replica bounds: the narrowest range.

The controller plans with :class:`NodePolicy` (``controller.state.build``) and the
node agent enforces it before touching NVML (``node.base.reshape_rules``); whether a
change may start now is one gate for both (``sharing.rules.reshape_gate``), so the
two can only disagree if they read different policies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from mig.migparted import builtin_config, layout_for
from mig.model import GpuModel
from sharing.api.crd import WEEKDAYS, SharingPolicySpec
from sharing.api.modes import AllocationMode
from sharing.rules.replicas import MAX_REPLICAS
from sharing.rules.windows import Window, minutes_of


@dataclass(frozen=True)
class PolicyWindows:
    """The reshaping windows of one SharingPolicy that restricts time."""

    policy: str
    windows: tuple[Window, ...]

    def open(self, moment: datetime) -> bool:
        return any(w.contains(moment) for w in self.windows)

    def describe(self) -> str:
        return ", ".join(w.describe() for w in self.windows)


@dataclass(frozen=True)
class NodePolicy:
    """The merged SharingPolicy bounds for one node (see the module docstring for the rules)."""

    names: tuple[str, ...]
    allowed_profiles: frozenset[str] | None = None
    """None: every profile of the model."""
    allowed_modes: frozenset[AllocationMode] = frozenset(("mig", "mps", "time-slicing"))
    static_layout: tuple[str, ...] | None = None
    """A pinned geometry (profile names, per GPU); None: dynamic."""
    windows: tuple[PolicyWindows, ...] = ()
    """One entry per SharingPolicy that restricts time; empty: any time."""
    max_concurrent: int = 1
    frozen_by: tuple[str, ...] = ()
    """The policies that say ``maxConcurrent: 0``."""
    idle_seconds: int = 300
    min_replicas: int = 1
    max_replicas: int = MAX_REPLICAS
    """With ``min_replicas``, the bounds of the replica count a split gives the node (``sharing.rules.replicas``)."""

    def window_open(self, now: datetime) -> bool:
        return self.closed_by(now) is None

    def closed_by(self, now: datetime) -> PolicyWindows | None:
        """The first policy none of whose windows is open at ``now``; None when reshaping may start."""
        return next((w for w in self.windows if not w.open(now)), None)

    def allows_profile(self, name: str) -> bool:
        return self.allowed_profiles is None or name in self.allowed_profiles


def static_layout(spec: SharingPolicySpec, model: GpuModel | None) -> tuple[str, ...] | None:
    """The pinned geometry of a static policy for ``model``; None when dynamic (or unknown for the model)."""
    layout = spec.layout
    if layout.mode != "static":
        return None
    if layout.instances is not None:
        return tuple(sorted(i.profile for i in layout.instances))
    if model is None or layout.mig_config is None:
        return None
    try:
        names = layout_for(builtin_config(layout.mig_config), model)
    except ValueError:
        return None
    return tuple(sorted(names)) if names is not None else None


def windows_of(name: str, spec: SharingPolicySpec) -> PolicyWindows | None:
    if not spec.reshaping.windows:
        return None
    return PolicyWindows(name, tuple(
        Window(minutes_of(w.start), minutes_of(w.end), frozenset(WEEKDAYS.index(d) for d in w.days))
        for w in spec.reshaping.windows
    ))


def merge(named: Iterable[tuple[str, SharingPolicySpec]], model: GpuModel | None) -> NodePolicy | None:
    """The strictest combination of the policies selecting one node; None when there are none."""
    items = sorted(named, key=lambda kv: kv[0])
    if not items:
        return None
    profiles: frozenset[str] | None = None
    static: tuple[str, ...] | None = None
    windows: list[PolicyWindows] = []
    for name, spec in items:
        if spec.allowed_profiles is not None:
            allowed = frozenset(spec.allowed_profiles)
            profiles = allowed if profiles is None else profiles & allowed
        pinned = static_layout(spec, model)
        if pinned is not None and static is None:
            static = pinned
        own = windows_of(name, spec)
        if own is not None:
            windows.append(own)
    return NodePolicy(
        names=tuple(name for name, _ in items),
        allowed_profiles=profiles,
        static_layout=static,
        windows=tuple(windows),
        max_concurrent=min(s.reshaping.max_concurrent for _, s in items),
        frozen_by=tuple(name for name, s in items if s.reshaping.max_concurrent == 0),
        idle_seconds=max(s.reshaping.idle_seconds for _, s in items),
        min_replicas=max(s.replicas.min for _, s in items),
        max_replicas=min(s.replicas.max for _, s in items),
    )


def policy_for_node(policies: Iterable[tuple[str, SharingPolicySpec]], labels: Mapping[str, str],
                    model: GpuModel | None) -> NodePolicy | None:
    """The merged policy of the policies whose node selector matches ``labels``; None when none does."""
    return merge(((n, s) for n, s in policies if s.node_selector.matches(labels)), model)


def policies_for_nodes(
    policies: Iterable[tuple[str, SharingPolicySpec]], nodes: Iterable[tuple[str, Mapping[str, str], GpuModel | None]]
) -> dict[str, NodePolicy]:
    """Node name -> merged policy, for every node some policy selects."""
    pol = list(policies)
    out: dict[str, NodePolicy] = {}
    for name, labels, model in nodes:
        merged = policy_for_node(pol, labels, model)
        if merged is not None:
            out[name] = merged
    return out
