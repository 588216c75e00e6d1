"""The simulated NVML backend: placement rules, NVML error codes, faults, persistence."""

from __future__ import annotations

from pathlib import Path

import pytest

from mig.catalog import get_model
from mig.model import Placement
from node.nvml import errors
from node.nvml.errors import NvmlError
from node.nvml.protocol import NvmlBackend
from node.nvml.simulated import Fault, SimulatedNvml

H200 = get_model("H200")
A30 = get_model("A30")


def _pid(model_name: str, profile: str) -> int:
    return get_model(model_name).profile(profile).profile_id


def test_is_an_nvml_backend_and_says_it_is_simulated() -> None:
    sim = SimulatedNvml(H200, 2)
    assert isinstance(sim, NvmlBackend)
    assert sim.kind == "simulated"
    info = sim.device_info(1)
    assert info.name == "NVIDIA H200" and info.pci_device_id == "0x233510DE"
    assert info.uuid != sim.device_info(0).uuid
    assert [p.name for p in sim.instance_profiles(0)] == list(H200.profile_names)


def test_create_and_destroy_round_trip() -> None:
    sim = SimulatedNvml(H200, 1)
    gi = sim.create_gpu_instance(0, _pid("H200", "3g.71gb"), Placement(4, 4))
    assert gi.profile == "3g.71gb" and gi.uuid.startswith("MIG-")
    assert [i.placed for i in sim.gpu_instances(0)] == [gi.placed]
    sim.destroy_gpu_instance(0, gi.gi_id)
    assert sim.gpu_instances(0) == ()


@pytest.mark.parametrize(
    ("setup", "profile", "placement", "code"),
    [
        pytest.param([], "3g.71gb", Placement(2, 4), errors.INVALID_ARGUMENT, id="placement-not-offered"),
        pytest.param([("4g.71gb", Placement(0, 4))], "3g.71gb", Placement(0, 4), errors.INSUFFICIENT_RESOURCES,
                     id="slices-taken"),
        pytest.param([("1g.18gb", Placement(i, 1)) for i in range(7)], "1g.18gb", Placement(7, 1),
                     errors.INVALID_ARGUMENT, id="eighth-slice-not-a-1g-placement"),
        pytest.param([("1g.18gb+me", Placement(0, 1))], "1g.18gb+me", Placement(1, 1), errors.INSUFFICIENT_RESOURCES,
                     id="one-media-extension"),
    ],
)
def test_create_refusals_carry_nvml_codes(
    setup: list[tuple[str, Placement]], profile: str, placement: Placement, code: int
) -> None:
    sim = SimulatedNvml(H200, 1)
    for name, where in setup:
        sim.create_gpu_instance(0, _pid("H200", name), where)
    with pytest.raises(NvmlError) as info:
        sim.create_gpu_instance(0, _pid("H200", profile), placement)
    assert info.value.code == code
    assert len(sim.gpu_instances(0)) == len(setup)


def test_valid_mixed_layout_is_accepted() -> None:
    sim = SimulatedNvml(H200, 1)
    sim.create_gpu_instance(0, _pid("H200", "4g.71gb"), Placement(0, 4))
    sim.create_gpu_instance(0, _pid("H200", "3g.71gb"), Placement(4, 4))
    assert sorted(str(i.placed) for i in sim.gpu_instances(0)) == ["3g.71gb@4:4", "4g.71gb@0:4"]


def test_unknown_profile_id_is_invalid_argument() -> None:
    sim = SimulatedNvml(A30, 1)
    with pytest.raises(NvmlError) as info:
        sim.create_gpu_instance(0, 999, Placement(0, 1))
    assert info.value.code == errors.INVALID_ARGUMENT


def test_destroy_in_use_instance_is_refused() -> None:
    sim = SimulatedNvml(H200, 1)
    gi = sim.create_gpu_instance(0, _pid("H200", "1g.18gb"), Placement(0, 1))
    sim.start_process(0, pid=4242, gi_id=gi.gi_id)
    with pytest.raises(NvmlError) as info:
        sim.destroy_gpu_instance(0, gi.gi_id)
    assert info.value.code == errors.IN_USE
    assert [i.gi_id for i in sim.gpu_instances(0)] == [gi.gi_id]
    assert sim.processes(0)[0].gi_id == gi.gi_id
    sim.stop_process(0, 4242)
    sim.destroy_gpu_instance(0, gi.gi_id)
    with pytest.raises(NvmlError) as again:
        sim.destroy_gpu_instance(0, gi.gi_id)
    assert again.value.code == errors.NOT_FOUND


def test_mig_mode_disabled_and_pending() -> None:
    sim = SimulatedNvml(H200, 1, mig_enabled=False)
    with pytest.raises(NvmlError) as off:
        sim.gpu_instances(0)
    assert off.value.code == errors.NOT_SUPPORTED
    util = sim.utilization(0)
    assert util.source == "nvml" and util.gpu_percent == 0.0
    sim.set_mig_mode(0, True)
    assert sim.device_info(0).mig_pending and not sim.device_info(0).mig_enabled
    with pytest.raises(NvmlError) as pending:
        sim.create_gpu_instance(0, _pid("H200", "7g.141gb"), Placement(0, 8))
    assert pending.value.code == errors.RESET_REQUIRED
    sim.reset_gpu(0)
    assert sim.device_info(0).mig_enabled
    assert sim.utilization(0).gpu_percent is None  # as NVML: no utilisation rate in MIG mode


def test_faults_fire_the_requested_number_of_times() -> None:
    sim = SimulatedNvml(H200, 2)
    sim.inject_fault(Fault("create", errors.INSUFFICIENT_RESOURCES, gpu=1, times=2))
    sim.create_gpu_instance(0, _pid("H200", "1g.18gb"), Placement(0, 1))  # other GPU unaffected
    for _ in range(2):
        with pytest.raises(NvmlError):
            sim.create_gpu_instance(1, _pid("H200", "1g.18gb"), Placement(0, 1))
    sim.create_gpu_instance(1, _pid("H200", "1g.18gb"), Placement(0, 1))
    assert len(sim.gpu_instances(1)) == 1


def test_fault_after_effect_changes_state_but_raises() -> None:
    sim = SimulatedNvml(H200, 1)
    sim.inject_fault(Fault("create", errors.UNKNOWN, after_effect=True))
    with pytest.raises(NvmlError):
        sim.create_gpu_instance(0, _pid("H200", "2g.35gb"), Placement(2, 2))
    assert [str(i.placed) for i in sim.gpu_instances(0)] == ["2g.35gb@2:2"]


def test_delays_use_the_injected_sleep() -> None:
    slept: list[float] = []
    sim = SimulatedNvml(H200, 1, delays={"destroy": 0.5}, sleep=slept.append)
    gi = sim.create_gpu_instance(0, _pid("H200", "1g.18gb"), Placement(3, 1))
    sim.destroy_gpu_instance(0, gi.gi_id)
    assert slept == [0.5]


def test_bad_settings_are_named() -> None:
    with pytest.raises(ValueError, match="unknown operation"):
        SimulatedNvml(H200, 1, delays={"explode": 1.0})
    with pytest.raises(ValueError, match="at least 1"):
        SimulatedNvml(H200, 0)
    with pytest.raises(ValueError, match="unknown operation"):
        SimulatedNvml(H200, 1).inject_fault(Fault("explode", errors.UNKNOWN))


def test_state_file_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    first = SimulatedNvml(H200, 2, path)
    gi = first.create_gpu_instance(1, _pid("H200", "3g.71gb"), Placement(0, 4))
    first.start_process(1, pid=7, used_memory_mib=2048, gi_id=gi.gi_id)
    second = SimulatedNvml(H200, 2, path)
    assert second.device_info(1).uuid == first.device_info(1).uuid
    assert second.gpu_instances(1) == first.gpu_instances(1)
    assert second.processes(1) == first.processes(1)
    assert second.utilization(1).memory_used_mib == 2048
    # New instances get fresh ids and UUIDs after the restart, as on hardware.
    other = second.create_gpu_instance(1, _pid("H200", "3g.71gb"), Placement(4, 4))
    assert other.gi_id != gi.gi_id and other.uuid != gi.uuid


@pytest.mark.parametrize(
    ("other_model", "count", "message"),
    [(A30, 2, "model"), (H200, 3, "holds 2 GPUs")],
    ids=["wrong-model", "wrong-count"],
)
def test_state_file_mismatch_is_refused(tmp_path: Path, other_model: object, count: int, message: str) -> None:
    path = tmp_path / "gpus.json"
    SimulatedNvml(H200, 2, path)
    with pytest.raises(ValueError, match=message):
        SimulatedNvml(other_model, count, path)  # type: ignore[arg-type]


def test_corrupt_state_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="state file"):
        SimulatedNvml(H200, 1, path)


def test_process_utilization_samples_busy_processes_once_per_period() -> None:
    sim = SimulatedNvml(get_model("H200"), 1, mig_enabled=False)
    now = [100.4]
    sim.clock = lambda: now[0]
    sim.start_process(0, 21, 4096)
    sim.start_process(0, 22, 4096)
    sim.set_process_load(0, 21, 30.0)
    sim.set_process_load(0, 22, 80.0)
    first = sim.process_utilization(0, 0)
    assert {(s.pid, s.sm_percent, s.timestamp_us) for s in first} == {(21, 30.0, 100_000_000), (22, 80.0, 100_000_000)}
    assert sim.process_utilization(0, 100_000_000) == ()  # same period: nothing newer (NVML's NOT_FOUND)
    sim.set_process_load(0, 22, 0.0)
    now[0] = 101.0
    assert [(s.pid, s.timestamp_us) for s in sim.process_utilization(0, 100_000_000)] == [(21, 101_000_000)]
    assert sim.utilization(0).gpu_percent == 30.0  # the GPU is busy while any process runs a kernel


def test_a_process_memory_can_be_set_and_is_checked() -> None:
    sim = SimulatedNvml(get_model("H200"), 1, mig_enabled=False)
    sim.start_process(0, 21, 4096)
    sim.set_process_memory(0, 21, 8192)
    assert [(p.pid, p.used_memory_mib) for p in sim.processes(0)] == [(21, 8192)]
    with pytest.raises(ValueError, match="no process 22 on GPU 0"):
        sim.set_process_memory(0, 22, 1)
    with pytest.raises(ValueError, match="must not be negative"):
        sim.set_process_memory(0, 21, -1)


def test_process_utilization_is_not_supported_in_mig_mode_and_takes_faults() -> None:
    sim = SimulatedNvml(H200, 1)
    with pytest.raises(NvmlError) as info:
        sim.process_utilization(0, 0)
    assert info.value.code == errors.NOT_SUPPORTED
    plain = SimulatedNvml(H200, 1, mig_enabled=False)
    plain.inject_fault(Fault("process_utilization", errors.NO_PERMISSION))
    with pytest.raises(NvmlError) as info:
        plain.process_utilization(0, 0)
    assert info.value.code == errors.NO_PERMISSION
    assert plain.process_utilization(0, 0) == ()


def test_process_load_is_checked_and_kept_across_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "nvml.json"
    sim = SimulatedNvml(H200, 1, state, mig_enabled=False)
    sim.start_process(0, 31, 512)
    with pytest.raises(ValueError, match="0..100"):
        sim.set_process_load(0, 31, 120.0)
    with pytest.raises(ValueError, match="no process 32"):
        sim.set_process_load(0, 32, 10.0)
    sim.set_process_load(0, 31, 55.0)
    again = SimulatedNvml(H200, 1, state)
    again.clock = lambda: 9.0
    assert [s.sm_percent for s in again.process_utilization(0, 0)] == [55.0]
