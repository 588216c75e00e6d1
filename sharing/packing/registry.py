"""Policy names accepted by the simulator and the controller, and their construction."""

from __future__ import annotations

import numpy as np

from sharing.packing.baselines import (
    BestFitPolicy,
    DotProductPolicy,
    GpuClusteringPolicy,
    GpuPackingPolicy,
    RandomPolicy,
)
from sharing.packing.fgd import FgdPolicy
from sharing.packing.policy import Policy
from sharing.packing.typical import TypicalPods

POLICY_NAMES: tuple[str, ...] = ("Random", "DotProd", "GpuClustering", "GpuPacking", "BestFit", "FGD", "gpupack")
"""Canonical names (the reference table's spelling); lookup is case-insensitive."""


def canonical_policy_name(name: str) -> str:
    """The canonical spelling of ``name``; ValueError naming the valid choices otherwise."""
    for known in POLICY_NAMES:
        if known.lower() == name.strip().lower():
            return known
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")


def make_policy(name: str, *, rng: np.random.Generator, typical: TypicalPods) -> Policy:
    """A fresh policy instance; ``rng`` is used by Random only, ``typical`` by FGD and gpupack."""
    canonical = canonical_policy_name(name)
    if canonical == "Random":
        return RandomPolicy(rng)
    if canonical == "DotProd":
        return DotProductPolicy()
    if canonical == "GpuClustering":
        return GpuClusteringPolicy()
    if canonical == "GpuPacking":
        return GpuPackingPolicy()
    if canonical == "BestFit":
        return BestFitPolicy()
    if canonical == "FGD":
        return FgdPolicy(typical)
    from sharing.packing.gpupack_policy import GpupackPolicy

    return GpupackPolicy(typical)
