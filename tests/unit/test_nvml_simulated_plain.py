"""The simulated NVML with GPUs without MIG (openb's GPU types): products, NVML's rules, faults,
persistence, the snapshot, the emulated device plugin, a full agent tick and the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpupack.cli import main
from mig.catalog import get_model, model_for_pci_device_id
from mig.model import GpuModel, Placement
from node.agent import Agent
from node.base.pods import SIM_PID_BASE
from node.base.device_plugin_emulator import advertise
from node.nvml import errors
from node.nvml.catalog_check import check_gpu
from node.nvml.errors import NvmlError
from node.nvml.products import (
    _PCI_DEVICE_IDS,
    PlainGpu,
    UnknownGpuError,
    find_openb_type,
    openb_plain_gpu,
    resolve_product,
    stand_in_memory_mib,
)
from node.nvml.protocol import NvmlBackend
from node.nvml.simulated import MPS_SERVER_MEMORY_MIB, MPS_SERVER_PID_BASE, SimulatedNvml, post_to_inbox, \
    simulated_backend
from node.base.settings import AgentSettings
from node.base.snapshot import read_snapshot, status_from_snapshot
from sharing.api.keys import PRODUCT_LABEL, REPLICAS_LABEL, SHARED_RESOURCE, STRATEGY_LABEL, WHOLE_RESOURCE
from mig.openb_gpus import OPENB_GPUS
from tests.unit.test_reconciler_agent import Clock, FakeKube

T4 = openb_plain_gpu("T4")
H200_PROFILE = get_model("H200").profile("1g.18gb")


# ------------------------------------------------------------------ products
@pytest.mark.parametrize(
    ("openb_type", "nvml_name", "pci_device_id"),
    [
        ("V100M16", "Tesla V100-SXM2-16GB", "0x1DB110DE"),
        ("V100M32", "Tesla V100-SXM2-32GB", "0x1DB510DE"),
        ("P100", "Tesla P100-PCIE-16GB", "0x15F810DE"),
        ("T4", "Tesla T4", "0x1EB810DE"),
        ("A10", "NVIDIA A10", "0x223610DE"),
    ],
)
def test_named_products_report_nvmls_real_name_and_device_id(openb_type: str, nvml_name: str,
                                                             pci_device_id: str) -> None:
    gpu = openb_plain_gpu(openb_type)
    assert (gpu.display_name, gpu.pci_device_id) == (nvml_name, pci_device_id)
    assert gpu.memory_mib == OPENB_GPUS[openb_type].memory_mib > 0


@pytest.mark.parametrize("openb_type", sorted(OPENB_GPUS))
def test_every_openb_type_is_the_product_models_product(openb_type: str) -> None:
    gpu = openb_plain_gpu(openb_type)
    assert gpu.product == OPENB_GPUS[openb_type].product
    assert gpu.display_name.replace(" ", "-") == gpu.product  # what GFD (and GpuSnapshot.product) makes of it
    assert gpu.mig_capable is False and gpu.openb_type == openb_type
    assert model_for_pci_device_id(gpu.pci_device_id) is None  # never mistaken for a MIG catalog model


def test_every_openb_type_has_a_distinct_device_id() -> None:
    assert set(_PCI_DEVICE_IDS) == set(OPENB_GPUS)
    assert len(set(_PCI_DEVICE_IDS.values())) == len(_PCI_DEVICE_IDS)


@pytest.mark.parametrize("openb_type", ["G2", "G3"])
def test_unknown_memory_reports_the_smallest_known_openb_gpu(openb_type: str) -> None:
    assert OPENB_GPUS[openb_type].memory_mib == 0  # the trace does not say
    assert openb_plain_gpu(openb_type).memory_mib == stand_in_memory_mib() == 16 * 1024


def test_plain_gpu_refuses_what_nvml_never_reports() -> None:
    with pytest.raises(ValueError, match="always reports GPU memory"):
        PlainGpu("Tesla-T4", "Tesla T4", "0x1EB810DE", 0)
    with pytest.raises(ValueError, match="does not give GFD's product"):
        PlainGpu("Tesla-T4", "Tesla T 4", "0x1EB810DE", 1024)


@pytest.mark.parametrize(
    ("name", "openb_type"),
    [("T4", "T4"), ("t4", "T4"), ("Tesla-T4", "T4"), ("tesla t4", "T4"), ("v100m16", "V100M16"),
     ("Tesla-V100-SXM2-16GB", "V100M16"), ("tesla-v100-sxm2-32gb", "V100M32"), ("NVIDIA A10", "A10"),
     ("g2", "G2"), ("openb-G3", "G3")],
)
def test_openb_types_resolve_by_type_or_product_in_any_case(name: str, openb_type: str) -> None:
    assert find_openb_type(name) == openb_type
    assert resolve_product(name) == openb_plain_gpu(openb_type)


def test_the_mig_catalog_is_asked_first() -> None:
    resolved = resolve_product("h200")
    assert isinstance(resolved, GpuModel) and resolved.product == "NVIDIA-H200"


def test_an_unknown_name_lists_both_kinds() -> None:
    with pytest.raises(UnknownGpuError) as info:
        resolve_product("Z9")
    text = str(info.value)
    assert "unknown GPU model 'Z9'" in text and "H200" in text and "T4 (Tesla-T4)" in text and "G2 (openb-G2)" in text
    assert isinstance(info.value, ValueError)


# ---------------------------------------------------------- the simulated GPU
def test_device_info_of_a_gpu_without_mig() -> None:
    sim = simulated_backend("T4", 2, seed="n1")
    assert isinstance(sim, NvmlBackend) and sim.kind == "simulated"
    info = sim.device_info(1)
    assert (info.name, info.pci_device_id, info.memory_total_mib) == ("Tesla T4", "0x1EB810DE", 16 * 1024)
    assert (info.mig_capable, info.mig_enabled, info.mig_pending) == (False, False, False)
    assert info.uuid.startswith("GPU-") and info.uuid != sim.device_info(0).uuid


def test_mig_mode_cannot_be_asked_for_at_start() -> None:
    with pytest.raises(ValueError, match="has no MIG"):
        SimulatedNvml(T4, 1, mig_enabled=True)
    assert SimulatedNvml(T4, 1, mig_enabled=False).device_info(0).mig_enabled is False


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda s: s.instance_profiles(0), id="instance-profiles"),
        pytest.param(lambda s: s.gpu_instances(0), id="gpu-instances"),
        pytest.param(lambda s: s.create_gpu_instance(0, H200_PROFILE.profile_id, Placement(0, 1)), id="create"),
        pytest.param(lambda s: s.destroy_gpu_instance(0, 1), id="destroy"),
        pytest.param(lambda s: s.set_mig_mode(0, True), id="enable-mig"),
        pytest.param(lambda s: s.set_mig_mode(0, False), id="disable-mig"),
    ],
)
def test_every_mig_call_is_not_supported(call: Any, tmp_path: Path) -> None:
    state = tmp_path / "s.json"
    sim = SimulatedNvml(T4, 1, state)
    before = state.read_text()
    with pytest.raises(NvmlError) as info:
        call(sim)
    assert info.value.code == errors.NOT_SUPPORTED and "does not support MIG" in str(info.value)
    assert state.read_text() == before
    sim.reset_gpu(0)  # a reset does not bring MIG mode about either
    assert sim.device_info(0).mig_enabled is False and sim.device_info(0).mig_pending is False


def test_the_catalog_check_reports_it_as_not_in_the_catalog() -> None:
    report = check_gpu(SimulatedNvml(T4, 1), 0)
    assert report.model is None and report.profiles == ()
    assert any("not in the catalog" in n for n in report.notes)


def test_processes_and_utilisation() -> None:
    sim = SimulatedNvml(T4, 2)
    sim.start_process(1, 4242, 3000)
    sim.set_load(1, 62.5)
    util = sim.utilization(1)
    assert (util.gpu_percent, util.memory_used_mib, util.memory_total_mib, util.processes, util.source) == (
        62.5, 3000, 16 * 1024, 1, "nvml")
    assert [(p.pid, p.gi_id) for p in sim.processes(1)] == [(4242, None)]
    assert sim.processes(0) == ()
    sim.stop_process(1, 4242)
    assert sim.processes(1) == () and sim.utilization(1).memory_used_mib == 0


def test_faults_on_a_gpu_without_mig() -> None:
    sim = SimulatedNvml(T4, 2)
    sim.inject_xid(0, 48)
    with pytest.raises(ValueError, match="no GPU instance 1"):
        sim.inject_xid(0, 94, gi_id=1)
    assert [(e.gpu_index, e.xid, e.gi_id) for e in sim.xid_events()] == [(0, 48, None)]
    sim.inject_ecc(1, 3)
    health = sim.memory_health(1)
    assert (health.volatile_uncorrected, health.aggregate_uncorrected, health.retired_pages_pending) == (3, 3, True)
    sim.start_process(1, 7)
    with pytest.raises(NvmlError) as busy:
        sim.reset_gpu(1)
    assert busy.value.code == errors.IN_USE
    sim.stop_process(1, 7)
    marker = sim.reset_marker(1)
    sim.reset_gpu(1)
    assert sim.reset_marker(1) != marker
    assert sim.memory_health(1).volatile_uncorrected == 0 and sim.memory_health(1).aggregate_uncorrected == 3
    sim.lose_gpu(0)
    with pytest.raises(NvmlError) as lost:
        sim.device_info(0)
    assert lost.value.code == errors.GPU_IS_LOST
    assert [e.xid for e in sim.xid_events()] == [79]
    boot = sim.boot_id()
    sim.reboot()
    assert sim.boot_id() != boot
    assert sim.device_info(0).mig_enabled is False  # a reboot brings no MIG mode either


def test_state_survives_a_restart_and_belongs_to_its_product(tmp_path: Path) -> None:
    state = tmp_path / "s.json"
    sim = simulated_backend("V100M32", 2, state, "n1")
    sim.start_process(0, 99, 2048)
    sim.inject_ecc(1, 2)
    uuids = [sim.device_info(i).uuid for i in range(2)]
    again = simulated_backend("tesla-v100-sxm2-32gb", 2, state, "n1")
    assert [again.device_info(i).uuid for i in range(2)] == uuids
    assert [(p.pid, p.used_memory_mib) for p in again.processes(0)] == [(99, 2048)]
    assert again.memory_health(1).aggregate_uncorrected == 2
    assert json.loads(state.read_text())["model"] == "Tesla-V100-SXM2-32GB"
    with pytest.raises(ValueError, match="state is for model 'Tesla-V100-SXM2-32GB'"):
        simulated_backend("V100M16", 2, state, "n1")
    with pytest.raises(ValueError, match="state is for model 'Tesla-V100-SXM2-32GB'"):
        simulated_backend("H200", 2, state, "n1")


def test_faults_posted_by_another_process_reach_it(tmp_path: Path) -> None:
    state = tmp_path / "s.json"
    sim = simulated_backend("A10", 1, state)
    post_to_inbox(state, {"op": "lose", "gpu": 0})
    assert sim.device_count() == 1
    with pytest.raises(NvmlError) as info:
        sim.utilization(0)
    assert info.value.code == errors.GPU_IS_LOST


def test_catalog_models_keep_mig_on_by_default() -> None:
    sim = simulated_backend("A30", 1)
    info = sim.device_info(0)
    assert info.mig_capable and info.mig_enabled and info.mig_pending
    assert not simulated_backend("A30", 1, mig_enabled=False).device_info(0).mig_enabled


# ------------------------------------------------- snapshot and advertisement
@pytest.mark.parametrize("openb_type", sorted(OPENB_GPUS))
def test_snapshot_and_status_carry_the_product_models_product(openb_type: str) -> None:
    snapshot = read_snapshot(simulated_backend(openb_type, 2), "simulated")
    assert snapshot.warnings == () and snapshot.error is None
    assert [g.model for g in snapshot.gpus] == [None, None]
    assert all(g.instances == () and g.utilization is not None for g in snapshot.gpus)
    status = status_from_snapshot(snapshot, {}, observed_generation=1, sharing=None, conditions=[], reconfiguration=None)
    assert status["product"] == OPENB_GPUS[openb_type].product
    assert [(g["product"], g["migEnabled"]) for g in status["gpus"]] == [(OPENB_GPUS[openb_type].product, False)] * 2
    assert all(g["memoryMiB"] > 0 for g in status["gpus"])


@pytest.mark.parametrize(
    ("mode", "replicas", "resources", "strategy"),
    [
        pytest.param("none", 1, {WHOLE_RESOURCE: 8}, "none", id="whole"),
        pytest.param("mps", 4, {SHARED_RESOURCE: 32}, "mps", id="mps"),
        pytest.param("time-slicing", 2, {SHARED_RESOURCE: 16}, "time-slicing", id="time-slicing"),
    ],
)
def test_the_emulated_device_plugin_advertises_whole_or_shared_gpus(
        mode: str, replicas: int, resources: dict[str, int], strategy: str) -> None:
    adv = advertise(read_snapshot(simulated_backend("T4", 8), "simulated"), mode, replicas)
    assert adv.resources == resources
    assert adv.labels[PRODUCT_LABEL] == "Tesla-T4"
    assert adv.labels["nvidia.com/gpu.count"] == "8" and adv.labels["nvidia.com/gpu.memory"] == "16384"
    assert adv.labels["nvidia.com/mig.capable"] == "false"
    assert (adv.labels[STRATEGY_LABEL], adv.labels[REPLICAS_LABEL]) == (strategy, str(replicas))
    assert not any(k.startswith("nvidia.com/mig-") for k in adv.labels)


def test_a_g2_node_advertises_its_stand_in_memory() -> None:
    adv = advertise(read_snapshot(simulated_backend("G2", 1), "simulated"), "mps", 2)
    assert adv.labels[PRODUCT_LABEL] == "openb-G2" and adv.labels["nvidia.com/gpu.memory"] == "16384"
    assert adv.resources == {SHARED_RESOURCE: 2}


# ------------------------------------------------------------ the agent, ticked
def _pod(name: str, resource: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ml", "name": name, "uid": f"uid-{name}"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"limits": {resource: "1"}}}]},
            "status": {"phase": "Running"}}


def test_an_agent_on_a_t4_node_publishes_and_shares_by_mps(tmp_path: Path) -> None:
    kube = FakeKube("n1")
    sim = simulated_backend("T4", 2, tmp_path / "s.json", "n1")
    settings = AgentSettings(node_name="n1", simulate="T4:2", emulate_device_plugin=True, idle_seconds=1.0,
                             min_patch_seconds=0.1, metrics_port=0)
    agent = Agent(settings, sim, kube, clock=Clock())  # type: ignore[arg-type]
    agent.tick()
    agent.tick()
    assert kube.gpunode is not None
    status = kube.gpunode["status"]
    assert status["product"] == "Tesla-T4" and [g["migEnabled"] for g in status["gpus"]] == [False, False]
    assert next(c for c in status["conditions"] if c["type"] == "LayoutApplied")["status"] == "True"
    assert kube.node["status"]["allocatable"] == {WHOLE_RESOURCE: "2"}
    assert kube.node["metadata"]["labels"][PRODUCT_LABEL] == "Tesla-T4"

    kube.set_spec({"sharing": {"mode": "mps", "replicas": 4}})
    kube.pods = [_pod("a", SHARED_RESOURCE), _pod("b", SHARED_RESOURCE)]
    for _ in range(3):
        agent.tick()
    assert kube.node["status"]["allocatable"] == {WHOLE_RESOURCE: "0", SHARED_RESOURCE: "8"}
    assert kube.node["metadata"]["labels"][STRATEGY_LABEL] == "mps"
    running = {i: sorted(p.pid for p in sim.processes(i)) for i in range(2)}
    clients = {i: [pid for pid in pids if pid >= SIM_PID_BASE] for i, pids in running.items()}
    assert sum(len(c) for c in clients.values()) == 2  # the emulated plugin ran the two pods
    # and, beside the clients of each GPU that has any, its MPS server
    assert running == {i: sorted(c + [MPS_SERVER_PID_BASE + i] if c else []) for i, c in clients.items()}
    assert all(p.gi_id is None for i in range(2) for p in sim.processes(i))

    # Restarted on the same state file: the same GPUs, and the pods' processes (and MPS servers) still there.
    again = simulated_backend("T4", 2, tmp_path / "s.json", "n1")
    assert {i: sorted(p.pid for p in again.processes(i)) for i in range(2)} == running


def test_an_agent_refuses_mig_on_a_gpu_without_it() -> None:
    kube = FakeKube("n1")
    sim = simulated_backend("T4", 1, seed="n1")
    settings = AgentSettings(node_name="n1", simulate="T4:1", emulate_device_plugin=True, idle_seconds=1.0,
                             min_patch_seconds=0.1, metrics_port=0)
    agent = Agent(settings, sim, kube, clock=Clock())  # type: ignore[arg-type]
    agent.tick()
    kube.set_spec({"gpus": [{"index": 0, "migEnabled": True, "layout": [{"profile": "1g.18gb"}]}]})
    for _ in range(3):
        agent.tick()
    assert kube.gpunode is not None
    applied = next(c for c in kube.gpunode["status"]["conditions"] if c["type"] == "LayoutApplied")
    assert applied["status"] == "False" and "is not MIG-capable" in applied["message"]
    assert "reset" not in applied["message"]
    assert sim.device_info(0).mig_enabled is False and kube.node["status"]["allocatable"] == {WHOLE_RESOURCE: "1"}


# ---------------------------------------------------------------------- CLI
@pytest.mark.parametrize(
    ("spec", "name", "memory"),
    [("T4:8", "Tesla T4", 16384), ("V100M32:4", "Tesla V100-SXM2-32GB", 32768),
     ("Tesla-V100-SXM2-16GB:1", "Tesla V100-SXM2-16GB", 16384), ("g3:2", "openb G3", 16384)],
)
def test_cli_snapshot_of_a_node_without_mig(spec: str, name: str, memory: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "snapshot", "--simulate", spec]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["gpus"]) == int(spec.rsplit(":", 1)[1]) and out["warnings"] == []
    first = out["gpus"][0]
    assert first["model"] is None and first["instances"] == []
    assert (first["device"]["name"], first["device"]["memory_total_mib"], first["device"]["mig_capable"]) == (
        name, memory, False)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["agent", "snapshot", "--simulate", "Z9:2"], "openb GPU types (no MIG): V100M16 (Tesla-V100-SXM2-16GB)"),
        (["agent", "snapshot", "--simulate", "Z9:2"], "MIG-capable models: NVIDIA-A30"),
        (["agent", "snapshot", "--simulate", "T4:17"], "1..16"),
        (["agent", "snapshot", "--simulate", "T4"], "MODEL:COUNT"),
        (["agent", "run", "--simulate", "T4:1"], "--node"),
    ],
    ids=["unknown-lists-openb", "unknown-lists-mig", "too-many", "no-count", "no-node"],
)
def test_cli_bad_input(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_cli_refuses_a_state_file_of_another_product(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = str(tmp_path / "s.json")
    assert main(["agent", "snapshot", "--simulate", "T4:2", "--state-file", state]) == 0
    capsys.readouterr()
    assert main(["agent", "snapshot", "--simulate", "A10:2", "--state-file", state]) == 2
    assert "state is for model 'Tesla-T4'" in capsys.readouterr().err


def test_agent_run_opens_the_same_backend(tmp_path: Path) -> None:
    from gpupack.cli_agent import open_backend

    settings = AgentSettings(node_name="n1", simulate="t4:8", state_file=str(tmp_path / "s.json"), metrics_port=0)
    backend, error = open_backend(settings)
    assert error == "" and isinstance(backend, SimulatedNvml)
    assert backend.device_count() == 8 and backend.device_info(7).name == "Tesla T4"
    assert backend.device_info(0).uuid == simulated_backend("T4", 8, tmp_path / "s.json", "n1").device_info(0).uuid


def test_under_mps_the_clients_sm_is_sampled_to_the_server_and_their_memory_stays_theirs(tmp_path: Path) -> None:
    # As the real NVML on an H200 (benchmarks/nvml_usage_check.md): only the MPS server has samples.
    sim = simulated_backend("T4", 1, tmp_path / "s.json", "n1")
    sim.clock = lambda: 100.0
    sim.set_mps(0, True)
    assert sim.processes(0) == ()  # no client, no server
    sim.start_process(0, SIM_PID_BASE + 1, 6916)
    sim.start_process(0, SIM_PID_BASE + 2, 13_060)
    sim.set_process_load(0, SIM_PID_BASE + 1, 80.0)
    sim.set_process_load(0, SIM_PID_BASE + 2, 30.0)
    server = MPS_SERVER_PID_BASE
    assert [(p.pid, p.used_memory_mib) for p in sim.processes(0)] == [
        (SIM_PID_BASE + 1, 6916), (SIM_PID_BASE + 2, 13_060), (server, MPS_SERVER_MEMORY_MIB)]
    assert [(s.pid, s.sm_percent) for s in sim.process_utilization(0, 0)] == [(server, 100.0)]  # summed, capped
    assert sim.utilization(0).memory_used_mib == 6916 + 13_060 + MPS_SERVER_MEMORY_MIB
    again = simulated_backend("T4", 1, tmp_path / "s.json", "n1")  # the GPU's MPS is persisted
    again.clock = lambda: 100.0
    assert [s.pid for s in again.process_utilization(0, 0)] == [server]
    sim.set_mps(0, False)  # time-slicing again: each process is sampled itself
    assert sorted(s.pid for s in sim.process_utilization(0, 0)) == [SIM_PID_BASE + 1, SIM_PID_BASE + 2]
    assert server not in [p.pid for p in sim.processes(0)]
