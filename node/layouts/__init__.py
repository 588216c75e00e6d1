"""How a MIG layout is applied: one seam, two implementations.

- :class:`~node.layouts.direct.DirectLayouts` (``--mode direct``): the agent
  reshapes through NVML, one GPU at a time, journaled in ``GPUNode`` status.
- :class:`~node.layouts.mig_manager.MigManagerLayouts` (``--mode operator``):
  the GPU Operator's mig-manager does, from a config the agent writes.

Both answer with a :class:`~node.base.conditions.LayoutReport`. The agent picks one
when it starts (:func:`layouts_for`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from node.base import conditions as C
from node.base.context import AgentContext
from node.base.snapshot import NodeSnapshot
from node.layouts.direct import DirectLayouts
from node.layouts.mig_manager import MigManagerLayouts
from sharing.api.crd import GPUNodeSpec

__all__ = ["DirectLayouts", "LayoutApplier", "MigManagerLayouts", "layouts_for"]


class LayoutApplier(Protocol):
    def reconcile(self, ctx: AgentContext, spec: GPUNodeSpec, generation: int, snapshot: NodeSnapshot,
                  reconf: Mapping[str, Any] | None, labels: Mapping[str, str]) -> C.LayoutReport:
        """One pass towards ``spec``'s layouts (``reconf``: the status's reconfiguration entry)."""
        ...


def layouts_for(mode: str) -> LayoutApplier:
    """``direct`` or ``operator`` (the agent's ``--mode``)."""
    if mode == "direct":
        return DirectLayouts()
    if mode == "operator":
        return MigManagerLayouts()
    raise ValueError(f"unknown agent mode {mode!r}; choose direct or operator")
