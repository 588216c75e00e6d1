"""``metav1.Condition`` bookkeeping for GPUNode status (pure)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sharing.api import LayoutRefusal

Status = Literal["True", "False", "Unknown"]

NVML_READY = "NvmlReady"
LAYOUT_APPLIED = "LayoutApplied"
DEVICE_PLUGIN_READY = "DevicePluginReady"
SPEC_VALID = "SpecValid"


@dataclass(frozen=True)
class Cond:
    type: str
    status: Status
    reason: str
    message: str


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


def merge_conditions(
    previous: Sequence[Mapping[str, Any]], new: Sequence[Cond], generation: int | None, now: dt.datetime
) -> list[dict[str, Any]]:
    """New conditions, keeping ``lastTransitionTime`` where the status did not change."""
    before = {c.get("type"): c for c in previous}
    result = []
    for cond in new:
        old = before.get(cond.type)
        since = old.get("lastTransitionTime") if old and old.get("status") == cond.status else None
        entry: dict[str, Any] = {
            "type": cond.type, "status": cond.status, "reason": cond.reason, "message": cond.message[:4000],
            "lastTransitionTime": since or now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        if generation is not None:
            entry["observedGeneration"] = generation
        result.append(entry)
    return result
