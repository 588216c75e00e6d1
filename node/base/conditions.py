"""The GPUNode conditions the node agent writes, and its typed report on requested layouts (pure).

``Cond`` and ``merge_conditions`` are the shared ones (``kube.conditions``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kube.conditions import Cond, Status, merge_conditions
from sharing.api.crd import LayoutRefusal

__all__ = [
    "DEVICE_PLUGIN_READY", "LAYOUT_APPLIED", "NVML_READY", "SPEC_VALID", "Cond", "LayoutReport", "Status",
    "merge_conditions",
]

NVML_READY = "NvmlReady"
LAYOUT_APPLIED = "LayoutApplied"
DEVICE_PLUGIN_READY = "DevicePluginReady"
SPEC_VALID = "SpecValid"


@dataclass(frozen=True)
class LayoutReport:
    """What one reconcile pass says about the requested layouts.

    ``condition`` is the ``LayoutApplied`` condition, prose for people;
    ``refusals`` is the typed answer per GPU the controller reads
    (``GPUStatus.layoutRefusal``); ``active``: a reconfiguration is in flight.
    """

    condition: Cond
    active: bool = False
    refusals: Mapping[int, LayoutRefusal] = field(default_factory=dict)
