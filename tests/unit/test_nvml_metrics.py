"""Prometheus metrics of the node agent reflect the NVML snapshot."""

from __future__ import annotations

from mig.catalog import get_model
from mig.model import Placement
from node.base.snapshot import read_snapshot
from node.metrics import AgentMetrics
from node.nvml.simulated import SimulatedNvml

H200 = get_model("H200")


def test_metrics_follow_the_snapshot() -> None:
    sim = SimulatedNvml(H200, 2)
    gi = sim.create_gpu_instance(0, H200.profile("3g.71gb").profile_id, Placement(0, 4))
    sim.create_gpu_instance(0, H200.profile("3g.71gb").profile_id, Placement(4, 4))
    sim.start_process(0, 11, 3000, gi.gi_id)
    metrics = AgentMetrics()
    snap = read_snapshot(sim, sim.kind)
    metrics.observe(snap, {g.info.index: g.busy_gi_ids() for g in snap.gpus})
    value = metrics.registry.get_sample_value
    assert value("gpupack_agent_gpus") == 2
    assert value("gpupack_agent_nvml_up") == 1
    assert value("gpupack_agent_backend_info", {"kind": "simulated"}) == 1
    assert value("gpupack_agent_mig_instances", {"gpu": "0", "profile": "3g.71gb"}) == 2
    assert value("gpupack_agent_mig_instances_in_use", {"gpu": "0", "profile": "3g.71gb"}) == 1
    assert value("gpupack_agent_gpu_memory_used_mib", {"gpu": "0"}) == 3000
    # MIG on, no DCGM: no utilisation sample rather than a made-up 0.
    assert value("gpupack_agent_gpu_utilization_percent", {"gpu": "0"}) is None
    # Instances go away: their series go with them.
    sim.stop_process(0, 11)
    for inst in sim.gpu_instances(0):
        sim.destroy_gpu_instance(0, inst.gi_id)
    snap = read_snapshot(sim, sim.kind)
    metrics.observe(snap, {})
    assert value("gpupack_agent_mig_instances", {"gpu": "0", "profile": "3g.71gb"}) is None
