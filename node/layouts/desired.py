"""What a ``GPUNode`` spec asks of each GPU, resolved against the NVML snapshot (pure).

``desired_layouts``: per GPU index a profile multiset, or None for "MIG off";
named mig-parted configs (``all-balanced``) are resolved through ``mig.migparted``;
problems (no such GPU, not MIG-capable, unknown config) are returned per index.
``pinned_layouts``: GPUs whose spec pins the start of *every* instance, with their
exact target layout.
"""

from __future__ import annotations

from mig.errors import MigError
from mig.migparted import builtin_config, layout_for
from mig.model import PlacedInstance, Placement
from node.base.snapshot import NodeSnapshot
from sharing.api.crd import GPUNodeSpec


def desired_layouts(spec: GPUNodeSpec, snapshot: NodeSnapshot) -> tuple[dict[int, list[str] | None], dict[int, str]]:
    desired: dict[int, list[str] | None] = {}
    problems: dict[int, str] = {}
    for g in spec.gpus:
        gpu = snapshot.gpu(g.index)
        if gpu is None:
            problems[g.index] = f"no such GPU on this node ({len(snapshot.gpus)} GPU(s))"
        elif not g.mig_enabled:
            desired[g.index] = None
        elif not gpu.info.mig_capable:
            # Said before the MIG-mode check would call it a mode change needing a reset: no reset helps.
            problems[g.index] = f"GPU {g.index} ({gpu.info.name}) is not MIG-capable; it can only be shared or whole"
        elif g.layout is not None:
            desired[g.index] = [i.profile for i in g.layout]
        elif g.mig_config is not None:
            if gpu.model is None:
                problems[g.index] = "not MIG-capable"  # MIG-capable, but no profile table known
                continue
            try:
                desired[g.index] = layout_for(builtin_config(g.mig_config), gpu.model, g.index)
            except MigError as exc:
                problems[g.index] = str(exc)
    return desired, problems


def pinned_layouts(spec: GPUNodeSpec, snapshot: NodeSnapshot) -> dict[int, tuple[PlacedInstance, ...]]:
    """GPUs whose spec pins the start of every instance: their exact target layout."""
    pinned: dict[int, tuple[PlacedInstance, ...]] = {}
    for g in spec.gpus:
        gpu = snapshot.gpu(g.index)
        if gpu is None or gpu.model is None or not g.layout or any(i.start is None for i in g.layout):
            continue
        if not all(gpu.model.has_profile(i.profile) for i in g.layout):
            continue  # decide_start refuses with the list of valid profiles
        pinned[g.index] = tuple(sorted(
            PlacedInstance(i.profile, Placement(int(i.start or 0), gpu.model.profile(i.profile).memory_slices))
            for i in g.layout))
    return pinned
