"""The SIMULATED device plugin / GFD: what it advertises for a layout and sharing config, and the MPS
memory limits its pods' processes start with."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from mig.catalog import get_model
from node.base.device_plugin_emulator import advertise, node_patches
from node.base.snapshot import read_snapshot
from node.nvml.simulated import SimulatedNvml
from node.advertising.emulated import EmulatedDevicePlugin, emulate_allocation
from node.base.pods import PodUse, assign_pods, pod_uses, sim_pid
from sharing.api.crd import GPUNodeSpec
from sharing.api.keys import SIMULATED_LABEL
from sharing.api.mps_env import PINNED_MEMORY_ENV

H200 = get_model("H200")


def _sim(layouts: list[list[str] | None]) -> SimulatedNvml:
    sim = SimulatedNvml(H200, len(layouts))
    for index, layout in enumerate(layouts):
        if layout is None:
            sim.set_mig_mode(index, False)
            sim.reset_gpu(index)
            continue
        from mig.geometry import fits

        placed = fits(H200, layout)
        assert placed is not None
        for inst in placed:
            sim.create_gpu_instance(index, H200.profile(inst.profile).profile_id, inst.placement)
    return sim


@pytest.mark.parametrize(
    ("layouts", "mode", "replicas", "expected"),
    [
        pytest.param([["3g.71gb", "3g.71gb"], ["7g.141gb"]], "none", 1,
                     {"nvidia.com/mig-3g.71gb": 2, "nvidia.com/mig-7g.141gb": 1}, id="mixed-strategy"),
        pytest.param([None, None], "none", 1, {"nvidia.com/gpu": 2}, id="whole-gpus"),
        pytest.param([None, ["1g.18gb"]], "time-slicing", 4,
                     {"nvidia.com/gpu.shared": 4, "nvidia.com/mig-1g.18gb": 1}, id="time-slicing-renames-full-gpus-only"),
        pytest.param([None, None], "mps", 3, {"nvidia.com/gpu.shared": 6}, id="mps-replicas"),
        pytest.param([None], "time-slicing", 1, {"nvidia.com/gpu": 1}, id="one-replica-is-not-sharing"),
    ],
)
def test_advertised_resources(layouts: list[list[str] | None], mode: str, replicas: int, expected: dict[str, int]) -> None:
    adv = advertise(read_snapshot(_sim(layouts), "simulated"), mode, replicas)
    assert adv.resources == expected
    assert adv.labels[SIMULATED_LABEL] == "true"
    assert adv.labels["nvidia.com/mig.strategy"] == "mixed"


def test_gfd_labels_per_profile() -> None:
    adv = advertise(read_snapshot(_sim([["3g.71gb", "3g.71gb"]]), "simulated"), "none", 1)
    assert adv.labels["nvidia.com/mig-3g.71gb.count"] == "2"
    assert adv.labels["nvidia.com/mig-3g.71gb.memory"] == str(H200.profile("3g.71gb").memory_mib)
    assert adv.labels["nvidia.com/mig-3g.71gb.slices.gi"] == "3"
    assert adv.labels["nvidia.com/gpu.product"] == "NVIDIA-H200"


def _node(labels: dict[str, str], capacity: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"labels": labels}, "status": {"capacity": capacity, "allocatable": dict(capacity)}}


def test_patches_zero_stale_resources_and_drop_stale_labels_but_keep_foreign_ones() -> None:
    adv = advertise(read_snapshot(_sim([["7g.141gb"]]), "simulated"), "none", 1)
    node = _node({"nvidia.com/mig-3g.71gb.count": "2", "nvidia.com/gpu.deploy.device-plugin": "true",
                  "nvidia.com/mig.config": "all-balanced"},
                 {"cpu": "8", "nvidia.com/mig-3g.71gb": "2"})
    status, meta = node_patches(adv, node)
    assert status is not None and meta is not None
    assert status["status"]["capacity"] == {"nvidia.com/mig-7g.141gb": "1", "nvidia.com/mig-3g.71gb": "0"}
    assert "cpu" not in status["status"]["allocatable"]
    labels = meta["metadata"]["labels"]
    assert labels["nvidia.com/mig-3g.71gb.count"] is None
    assert "nvidia.com/gpu.deploy.device-plugin" not in labels and "nvidia.com/mig.config" not in labels


def test_paused_device_plugin_means_nothing_allocatable() -> None:
    adv = advertise(read_snapshot(_sim([["7g.141gb"]]), "simulated"), "none", 1)
    status, _ = node_patches(adv, _node({"nvidia.com/gpu.deploy.device-plugin": "false"}, {}))
    assert status is not None
    assert status["status"]["capacity"]["nvidia.com/mig-7g.141gb"] == "1"
    assert status["status"]["allocatable"]["nvidia.com/mig-7g.141gb"] == "0"


def test_no_patch_when_node_already_matches() -> None:
    adv = advertise(read_snapshot(_sim([["7g.141gb"]]), "simulated"), "none", 1)
    status, meta = node_patches(adv, _node(dict(adv.labels), {"nvidia.com/mig-7g.141gb": "1"}))
    assert status is None and meta is None


def test_assign_pods_keeps_existing_and_fills_free_devices() -> None:
    snap = read_snapshot(_sim([["3g.71gb", "3g.71gb"], None]), "simulated")
    mig = [i.uuid for i in snap.gpus[0].instances]
    uses = [PodUse("a/p1", "u1", "nvidia.com/mig-3g.71gb", 1), PodUse("a/p2", "u2", "nvidia.com/mig-3g.71gb", 1),
            PodUse("a/p3", "u3", "nvidia.com/mig-3g.71gb", 1), PodUse("a/p4", "u4", "nvidia.com/gpu.shared", 2)]
    result = assign_pods(snap, uses, {"u2/0": mig[0]}, replicas=2)
    assert result["u2/0"] == mig[0]
    assert result["u1/0"] == mig[1]
    assert "u3/0" not in result  # no third 3g: the real kubelet would reject the pod
    assert result["u4/0"] == result["u4/1"] == snap.gpus[1].info.uuid  # two shares of the one full GPU


def _pod(uid: str, env: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"namespace": "ml", "name": uid, "uid": uid},
            "spec": {"nodeName": "n1", "containers": [
                {"name": "main", "env": env, "resources": {"limits": {"nvidia.com/gpu.shared": "1"}}}]}}


def _publish(plugin: EmulatedDevicePlugin, sim: SimulatedNvml, mode: str, replicas: int) -> None:
    kube = SimpleNamespace(patch_node=lambda *a: None, patch_node_status=lambda *a: None)
    ctx: Any = SimpleNamespace(backend=sim, kube=kube, s=SimpleNamespace(node_name="n1"))
    spec = GPUNodeSpec.model_validate({"sharing": {"mode": mode, "replicas": replicas}})
    plugin.publish(ctx, read_snapshot(sim, "simulated"), _node({}, {}), spec, {})


def test_mps_clients_start_with_the_limit_the_real_stack_gives(caplog: pytest.LogCaptureFixture) -> None:
    # H200, MPS, 4 replicas: the device plugin's daemon gives each client a quarter of the GPU; the
    # webhook's 16 GiB in a container's env narrows it; a literal value only (valueFrom is not resolved).
    sim = _sim([None])
    plugin = EmulatedDevicePlugin()
    _publish(plugin, sim, "mps", 4)
    pods = [_pod("u-sized", [{"name": PINNED_MEMORY_ENV, "value": "0=16384M"}]),
            _pod("u-plain", [{"name": "OTHER", "value": "x"}, {"name": PINNED_MEMORY_ENV, "valueFrom": {}}]),
            _pod("u-bad", [{"name": PINNED_MEMORY_ENV, "value": "0=16 GiB"}])]
    uses = pod_uses(pods, "n1")
    for _ in range(2):  # the refused pod is warned about once
        emulate_allocation(sim, read_snapshot(sim, "simulated"), uses, {}, 4, refused=plugin.refused)
    assert sim.mps_memory_limits(0) == {sim_pid("u-sized"): 16384, sim_pid("u-plain"): H200.memory_mib // 4}
    refusals = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(refusals) == 1 and "ml/u-bad" in refusals[0] and "'0=16 GiB'" in refusals[0]


def test_time_sliced_clients_start_without_a_limit() -> None:
    sim = _sim([None])
    _publish(EmulatedDevicePlugin(), sim, "time-slicing", 4)
    uses = pod_uses([_pod("u-sized", [{"name": PINNED_MEMORY_ENV, "value": "0=16384M"}])], "n1")
    emulate_allocation(sim, read_snapshot(sim, "simulated"), uses, {}, 4)
    assert sim.mps_memory_limits(0) == {sim_pid("u-sized"): None}
