"""NVML snapshot -> GPUNode status, unknown models, NVML failures, pod mapping, operator-mode helpers."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mig.catalog import get_model
from mig.migparted import parse_config
from mig.model import Placement
from node.base.snapshot import model_from_nvml, read_snapshot, status_from_snapshot
from node.nvml import errors
from node.nvml.errors import NvmlError
from node.nvml.protocol import DeviceInfo, InstanceProfile
from node.nvml.simulated import Fault, SimulatedNvml
from controller.writes.mig_configs import published_config
from node.base.operator_mode import device_plugin_config, handshake_state, plan_node_config
from sharing.api.gpunode import MigConfigRequest
from sharing.api.keys import mig_config_name, per_node_name
from node.base.pods import PodUse, busy_instances, pod_uid_of_pid, pod_uses, pods_by_device
from sharing.api.crd import GPUNodeStatus

H200 = get_model("H200")


def _sim() -> SimulatedNvml:
    sim = SimulatedNvml(H200, 2)
    sim.create_gpu_instance(0, H200.profile("3g.71gb").profile_id, Placement(0, 4))
    sim.create_gpu_instance(0, H200.profile("3g.71gb").profile_id, Placement(4, 4))
    return sim


def test_status_is_valid_and_marks_used_instances() -> None:
    sim = _sim()
    gi = sim.gpu_instances(0)[1]
    sim.start_process(0, 77, 4096, gi.gi_id)
    snap = read_snapshot(sim, sim.kind)
    status = status_from_snapshot(snap, {sim.gpu_instances(0)[0].uuid: ["ns/a"]}, observed_generation=4,
                                  sharing={"mode": "none", "replicas": 1}, conditions=[], reconfiguration=None)
    GPUNodeStatus.model_validate(status)
    gpu0 = status["gpus"][0]
    assert [(i["start"], i["inUse"], i["pods"]) for i in gpu0["instances"]] == [(0, True, ["ns/a"]), (4, True, [])]
    assert gpu0["utilization"] == {"memoryUsedMiB": 4096}  # MIG on: no utilisation percentage
    assert status["summary"] == {"gpus": 2, "migInstances": 2, "instancesInUse": 2, "unhealthyGpus": 0,
                                 "unhealthyInstances": 0, "degraded": False}
    assert status["observedGeneration"] == 4


def test_nvml_missing_is_an_error_not_an_exception() -> None:
    class Broken:
        def device_count(self) -> int:
            raise NvmlError(errors.LIBRARY_NOT_FOUND, "no driver")

    snap = read_snapshot(Broken(), "nvml")  # type: ignore[arg-type]
    assert snap.error is not None and "LIBRARY_NOT_FOUND" in snap.error and snap.gpus == ()


def test_one_failing_gpu_is_reported_and_the_others_still_read() -> None:
    sim = _sim()
    sim.inject_fault(Fault("gpu_instances", errors.GPU_IS_LOST, gpu=1))
    snap = read_snapshot(sim, sim.kind)
    assert snap.gpus[0].error is None and len(snap.gpus[0].instances) == 2
    assert snap.gpus[1].error is not None and "GPU_IS_LOST" in snap.gpus[1].error
    assert any("GPU 1" in w for w in snap.warnings)


def test_unknown_model_is_built_from_nvml_profiles() -> None:
    info = DeviceInfo(0, "GPU-x", "NVIDIA X999", "0x999910DE", "0:1:0.0", 100_000, True, True, True)
    profiles = (InstanceProfile("1g.12gb", 19, 0, 1, 12000, 7, tuple(Placement(i, 1) for i in range(7))),
                InstanceProfile("7g.96gb", 0, 4, 7, 96000, 1, (Placement(0, 8),)))
    model = model_from_nvml(info, profiles)
    assert model.memory_slices == 8 and model.compute_slices == 7
    assert model.profile("7g.96gb").memory_slices == 8
    assert "not in gpupack's catalog" in model.source


def test_pod_uses_and_mapping(tmp_path: Path) -> None:
    pods = [
        {"metadata": {"namespace": "a", "name": "p", "uid": "u-1"}, "spec": {"nodeName": "n", "containers": [
            {"resources": {"limits": {"nvidia.com/mig-3g.71gb": "1", "cpu": "1"}}}]}, "status": {"phase": "Running"}},
        {"metadata": {"namespace": "a", "name": "done", "uid": "u-2"}, "spec": {"nodeName": "n", "containers": [
            {"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}, "status": {"phase": "Succeeded"}},
        {"metadata": {"namespace": "a", "name": "elsewhere", "uid": "u-3"}, "spec": {"nodeName": "m", "containers": [
            {"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}},
    ]
    uses = pod_uses(pods, "n")
    assert uses == [PodUse("a/p", "u-1", "nvidia.com/mig-3g.71gb", 1)]
    sim = _sim()
    snap = read_snapshot(sim, sim.kind)
    by_device, unresolved = pods_by_device(snap, uses, {})
    assert by_device == {} and unresolved == uses
    # An unresolved pod of a profile makes every instance of that profile count as busy.
    assert len(busy_instances(snap.gpus[0], by_device, unresolved)) == 2
    # With its process found, only its own instance is busy.
    gi = snap.gpus[0].instances[0]
    sim.start_process(0, 321, 100, gi.gi_id)
    snap = read_snapshot(sim, sim.kind)
    by_device, unresolved = pods_by_device(snap, uses, {321: "u-1"})
    assert by_device == {gi.uuid: ["a/p"]} and unresolved == []
    assert busy_instances(snap.gpus[0], by_device, unresolved) == {gi.placed}


def test_pod_uid_from_cgroup(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(
        "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1a2b3c4d_1111_2222_3333_444455556666.slice/"
        "cri-containerd-abc.scope\n")
    assert pod_uid_of_pid(42, tmp_path) == "1a2b3c4d-1111-2222-3333-444455556666"
    (tmp_path / "43").mkdir()
    (tmp_path / "43" / "cgroup").write_text("0::/user.slice/session-1.scope\n")
    assert pod_uid_of_pid(43, tmp_path) is None
    assert pod_uid_of_pid(44, tmp_path) is None


def test_operator_config_changes_only_idle_gpus_and_prunes_old_entries() -> None:
    sim = _sim()
    snap = read_snapshot(sim, sim.kind)
    plan = plan_node_config("node-a", 7, snap, {0: ["7g.141gb"], 1: ["1g.18gb"] * 2}, idle_gpus=frozenset({1}))
    assert plan.changed == (1,) and 0 in plan.held
    text = published_config(None, [("node-a", MigConfigRequest(plan.name, plan.entries))])
    assert text is not None
    config = parse_config(text)
    entries = config.mig_configs[mig_config_name("node-a", 7)]
    assert entries[0].mig_devices == {"3g.71gb": 2}  # held at its current layout
    assert entries[1].mig_devices == {"1g.18gb": 2}
    later = plan_node_config("node-a", 8, snap, {1: ["7g.141gb"]}, idle_gpus=frozenset({0, 1}))
    other = plan_node_config("node-b", 1, snap, {}, idle_gpus=frozenset())
    both = published_config(text, [("node-b", MigConfigRequest(other.name, other.entries)),
                                   ("node-a", MigConfigRequest(later.name, later.entries))])
    assert both is not None
    merged = parse_config(both)
    assert set(merged.mig_configs) == {mig_config_name("node-a", 8), mig_config_name("node-b", 1)}


def test_handshake_states() -> None:
    name = mig_config_name("n", 2)
    labels = {"nvidia.com/mig.config": name, "nvidia.com/mig.config.state": "success"}
    assert handshake_state(labels, name, 5, 60) == "success"
    assert handshake_state({**labels, "nvidia.com/mig.config.state": "failed"}, name, 5, 60) == "failed"
    assert handshake_state({**labels, "nvidia.com/mig.config.state": "pending"}, name, 5, 60) == "pending"
    # A success of an older config does not count.
    assert handshake_state({**labels, "nvidia.com/mig.config": "other"}, name, 5, 60) == "pending"
    assert handshake_state({}, name, 61, 60) == "timeout"


def test_device_plugin_config() -> None:
    doc = yaml.safe_load(device_plugin_config("time-slicing", 4))
    assert doc["version"] == "v1" and doc["flags"]["migStrategy"] == "mixed"
    ts = doc["sharing"]["timeSlicing"]
    assert ts["renameByDefault"] is True and ts["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}]
    assert "mps" in yaml.safe_load(device_plugin_config("mps", 2))["sharing"]
    assert "sharing" not in yaml.safe_load(device_plugin_config("none", 1))


@pytest.mark.parametrize("node", ["gpu-a", "n" * 42, "n" * 43, "x" * 253])
def test_device_plugin_entry_names_have_the_shape_the_admission_policy_allows(node: str) -> None:
    """manifests/agent/node-restriction-policy.yaml recomputes this name in CEL (which has no hash):
    ``gpupack-<node>`` up to 50 characters, else its first 41, '-' and 8 more. Change both together."""
    key, full = per_node_name(node), f"gpupack-{node}"
    if len(full) <= 50:
        assert key == full
    else:
        assert len(key) == 50 and key.startswith(full[:41] + "-")
