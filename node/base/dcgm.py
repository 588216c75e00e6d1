"""GPU activity from DCGM (via dcgm-exporter) where NVML has none: MIG-enabled GPUs.

``nvmlDeviceGetUtilizationRates`` is NOT_SUPPORTED in MIG mode; DCGM's profiling
field ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (ratio 0..1 of time the graphics/compute
engine was busy) is reported per MIG instance, with the labels ``UUID`` (the
parent GPU) and ``GPU_I_ID`` (the GPU-instance id). A GPU's activity is the
instances' activities weighted by their compute slices over the GPU's slices, so
an idle 4g next to a busy 3g reads 3/7 busy. Whole-GPU rows (no ``GPU_I_ID``) are
used as they are.

Fetching is the caller's (the agent reads ``dcgm_exporter_url`` with httpx); the
parsing here is pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prometheus_client.parser import text_string_to_metric_families

from mig.model import GpuModel
from node.nvml.protocol import GpuInstance

ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"

Activity = dict[tuple[str, int | None], float]
"""(GPU UUID, GPU-instance id or None for the whole GPU) -> busy ratio 0..1."""


def parse_activity(text: str) -> Activity:
    activity: Activity = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != ENGINE_ACTIVE:
                continue
            uuid = sample.labels.get("UUID", "")
            if not uuid:
                continue
            gi = sample.labels.get("GPU_I_ID")
            try:
                key = (uuid, int(gi) if gi not in (None, "") else None)
            except ValueError:
                continue
            activity[key] = max(0.0, min(1.0, float(sample.value)))
    return activity


def gpu_percent(activity: Mapping[tuple[str, int | None], float], gpu_uuid: str,
                instances: Sequence[GpuInstance], model: GpuModel | None) -> float | None:
    """Activity of one GPU in percent, or None if DCGM says nothing about it."""
    whole = activity.get((gpu_uuid, None))
    if not instances or model is None:
        return None if whole is None else whole * 100
    total = 0.0
    seen = False
    for inst in instances:
        ratio = activity.get((gpu_uuid, inst.gi_id))
        if ratio is None:
            continue
        seen = True
        slices = model.profile(inst.profile).compute_slices if model.has_profile(inst.profile) else 1
        total += ratio * slices
    if not seen:
        return None if whole is None else whole * 100
    return 100.0 * total / model.compute_slices
