"""Which SharingPolicy bounds apply to a node, merged to the strictest.

A node selected by no policy is never reshaped: gpupack changes GPUs only where
an admin opted in. A node selected by several policies gets the strictest of
each bound (intersection of allowed profiles, every window must be open, the
smallest ``maxConcurrent``, the longest idle time, the narrowest replica
range), so adding a policy can only restrict what gpupack does, never widen it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from controller.view import NodePolicy, Window
from sharing.modes import AllocationMode
from mig.migparted import builtin_config, layout_for
from mig.model import GpuModel
from sharing.crd import WEEKDAYS, SharingPolicySpec
from sharing.windows import minutes_of


def selects(spec: SharingPolicySpec, labels: Mapping[str, str]) -> bool:
    return spec.node_selector.matches(labels)


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


def merge(named: Iterable[tuple[str, SharingPolicySpec]], model: GpuModel | None) -> NodePolicy | None:
    """The strictest combination of the policies selecting one node; None when there are none."""
    items = sorted(named, key=lambda kv: kv[0])
    if not items:
        return None
    profiles: frozenset[str] | None = None
    modes: frozenset[AllocationMode] = frozenset(("mig", "mps", "time-slicing"))
    window_sets: list[tuple[Window, ...]] = []
    static: tuple[str, ...] | None = None
    for _, spec in items:
        if spec.allowed_profiles is not None:
            allowed = frozenset(spec.allowed_profiles)
            profiles = allowed if profiles is None else profiles & allowed
        pinned = static_layout(spec, model)
        if pinned is not None and static is None:
            static = pinned
        if spec.reshaping.windows:
            window_sets.append(tuple(
                Window(minutes_of(w.start), minutes_of(w.end), frozenset(WEEKDAYS.index(d) for d in w.days))
                for w in spec.reshaping.windows
            ))
    return NodePolicy(
        names=tuple(name for name, _ in items),
        allowed_profiles=profiles,
        allowed_modes=modes,
        static_layout=static,
        windows=tuple(window_sets),
        max_concurrent=min(s.reshaping.max_concurrent for _, s in items),
        idle_seconds=max(s.reshaping.idle_seconds for _, s in items),
        min_replicas=max(s.replicas.min for _, s in items),
        max_replicas=min(s.replicas.max for _, s in items),
        target_utilization=min(s.replicas.target_utilization for _, s in items),
    )


def policies_for_nodes(
    policies: Iterable[tuple[str, SharingPolicySpec]], nodes: Iterable[tuple[str, Mapping[str, str], GpuModel | None]]
) -> dict[str, NodePolicy]:
    """Node name -> merged policy, for every node some policy selects."""
    pol = list(policies)
    out: dict[str, NodePolicy] = {}
    for name, labels, model in nodes:
        merged = merge(((n, s) for n, s in pol if selects(s, labels)), model)
        if merged is not None:
            out[name] = merged
    return out
