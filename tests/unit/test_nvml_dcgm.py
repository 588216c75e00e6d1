"""DCGM activity for MIG-enabled GPUs (where NVML reports no utilisation)."""

from __future__ import annotations

import pytest

from mig.catalog import get_model
from mig.model import Placement
from node.base.dcgm import gpu_percent, parse_activity
from node.base.snapshot import read_snapshot
from node.nvml.simulated import SimulatedNvml

H200 = get_model("H200")


def _exporter_text(gpu_uuid: str, rows: dict[int | None, float]) -> str:
    lines = ["# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.",
             "# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge",
             "# TYPE DCGM_FI_DEV_FB_USED gauge",
             f'DCGM_FI_DEV_FB_USED{{gpu="0",UUID="{gpu_uuid}"}} 1234']
    for gi, value in rows.items():
        extra = "" if gi is None else f',GPU_I_ID="{gi}",GPU_I_PROFILE="x"'
        lines.append(f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu="0",UUID="{gpu_uuid}"{extra}}} {value}')
    return "\n".join(lines) + "\n"


def test_mig_gpu_activity_is_weighted_by_compute_slices() -> None:
    sim = SimulatedNvml(H200, 1)
    four = sim.create_gpu_instance(0, H200.profile("4g.71gb").profile_id, Placement(0, 4))
    three = sim.create_gpu_instance(0, H200.profile("3g.71gb").profile_id, Placement(4, 4))
    uuid = sim.device_info(0).uuid
    activity = parse_activity(_exporter_text(uuid, {four.gi_id: 0.0, three.gi_id: 1.0}))
    assert activity == {(uuid, four.gi_id): 0.0, (uuid, three.gi_id): 1.0}
    assert gpu_percent(activity, uuid, sim.gpu_instances(0), H200) == pytest.approx(100 * 3 / 7)
    snap = read_snapshot(sim, sim.kind, activity)
    util = snap.gpus[0].utilization
    assert util is not None and util.source == "dcgm" and util.gpu_percent == pytest.approx(100 * 3 / 7)
    # Without DCGM the same GPU has no utilisation figure, as NVML in MIG mode.
    plain = read_snapshot(sim, sim.kind).gpus[0].utilization
    assert plain is not None and plain.gpu_percent is None and plain.source == "memory-and-processes"


def test_whole_gpu_rows_and_unknown_gpus() -> None:
    activity = parse_activity(_exporter_text("GPU-a", {None: 0.25}))
    assert gpu_percent(activity, "GPU-a", (), H200) == 25.0
    assert gpu_percent(activity, "GPU-b", (), H200) is None


def test_out_of_range_and_garbage_values() -> None:
    activity = parse_activity(_exporter_text("GPU-a", {None: 7.0}))
    assert activity[("GPU-a", None)] == 1.0
    with pytest.raises(ValueError):
        parse_activity("DCGM_FI_PROF_GR_ENGINE_ACTIVE{UUID=\"GPU-a\"} not-a-number\n")
