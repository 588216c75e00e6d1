"""The agent's per-pod GPU use, ticked on a simulated MPS node: metrics per pod, series of gone
pods removed, an NVML that cannot read process utilisation, the setting that turns it off, and
simulated pods playing a usage trace."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpupack.cli import load_usage_trace
from gpupack.testing.usage_traces import GIB, write_usage_trace
from node.agent import Agent
from node.base.pods import sim_pid
from node.base.settings import AgentSettings
from node.nvml import errors
from node.nvml.errors import NvmlError
from node.nvml.simulated import Fault, SimulatedNvml, simulated_backend
from sharing.api.keys import SHARED_RESOURCE, WHOLE_RESOURCE
from tests.unit.test_nvml_simulated_plain import _pod
from tests.unit.test_reconciler_agent import Clock, FakeKube


def _shared_node(tmp_path: Path, mode: str = "time-slicing", **changes: object) -> tuple[Agent, SimulatedNvml,
                                                                                         FakeKube]:
    kube = FakeKube("n1")
    sim = simulated_backend("T4", 1, tmp_path / "s.json", "n1")
    settings = AgentSettings(node_name="n1", simulate="T4:1", emulate_device_plugin=True, min_patch_seconds=0.1,
                             metrics_port=0).with_(**changes)
    agent = Agent(settings, sim, kube, clock=Clock())  # type: ignore[arg-type]
    agent.tick()
    kube.set_spec({"sharing": {"mode": mode, "replicas": 4}})
    kube.pods = [_pod("a", SHARED_RESOURCE), _pod("b", SHARED_RESOURCE)]
    for _ in range(3):
        agent.tick()
    sim.clock = Clock()  # samples move on one period per read
    return agent, sim, kube


def _value(agent: Agent, name: str, pod: str) -> float | None:
    uuid = agent.snapshot().gpus[0].info.uuid
    labels = {"gpu": "0", "UUID": uuid, "GPU_I_ID": "", "namespace": "ml", "pod": pod, "container": "c"}
    return agent.metrics.registry.get_sample_value(name, labels)


def test_pods_sharing_a_gpu_each_get_their_own_use(tmp_path: Path) -> None:
    agent, sim, kube = _shared_node(tmp_path)
    assert len(sim.processes(0)) == 2  # the emulated device plugin ran both pods on the one GPU
    sim.set_process_load(0, sim_pid("uid-a"), 30.0)
    sim.set_process_load(0, sim_pid("uid-b"), 60.0)
    agent.tick()
    assert (_value(agent, "DCGM_FI_DEV_GPU_UTIL", "a"), _value(agent, "DCGM_FI_DEV_GPU_UTIL", "b")) == (30.0, 60.0)
    assert _value(agent, "gpupack_pod_gpu_use_attributed", "a") == 1.0
    assert _value(agent, "DCGM_FI_DEV_FB_USED", "b") == sim.processes(0)[1].used_memory_mib

    kube.pods = [_pod("a", SHARED_RESOURCE)]  # b is gone: its series go with it
    agent.tick()
    assert _value(agent, "DCGM_FI_DEV_GPU_UTIL", "b") is None
    assert _value(agent, "gpupack_pod_gpu_use_attributed", "b") is None
    assert _value(agent, "gpupack_pod_gpu_use_attributed", "a") == 1.0


def test_pods_sharing_a_gpu_through_mps_get_their_memory_not_their_compute(tmp_path: Path) -> None:
    agent, sim, _kube = _shared_node(tmp_path, "mps")
    sim.set_process_load(0, sim_pid("uid-a"), 30.0)
    agent.tick()
    for pod in ("a", "b"):  # NVML samples the MPS server, not its clients: whose SMs is unknown
        assert _value(agent, "DCGM_FI_DEV_GPU_UTIL", pod) is None
        assert _value(agent, "gpupack_pod_gpu_use_attributed", pod) == 0.0
        assert _value(agent, "gpupack_pod_gpu_memory_attributed", pod) == 1.0
    assert _value(agent, "DCGM_FI_DEV_FB_USED", "a") == 1024.0  # each client's own memory


def test_unreadable_process_utilisation_unattributes_the_gpus_pods_and_logs_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    agent, sim, _kube = _shared_node(tmp_path)
    sim.set_process_load(0, sim_pid("uid-a"), 30.0)
    agent.tick()
    assert _value(agent, "DCGM_FI_DEV_GPU_UTIL", "a") == 30.0
    sim.inject_fault(Fault("process_utilization", errors.NO_PERMISSION, times=3))
    with caplog.at_level(logging.WARNING, logger="gpupack.agent"):
        for _ in range(3):
            agent.tick()
    assert _value(agent, "gpupack_pod_gpu_use_attributed", "a") == 0.0
    assert _value(agent, "DCGM_FI_DEV_GPU_UTIL", "a") is None  # no figure rather than a guessed one
    assert _value(agent, "DCGM_FI_DEV_FB_USED", "a") is not None  # memory is still measured
    assert sum("per-process utilisation unreadable" in r.getMessage() for r in caplog.records) == 1
    agent.tick()  # the fault is spent: measured again
    assert _value(agent, "DCGM_FI_DEV_GPU_UTIL", "a") == 30.0


def test_the_setting_turns_it_off(tmp_path: Path) -> None:
    agent, sim, _kube = _shared_node(tmp_path, pod_usage=False)
    sim.inject_fault(Fault("process_utilization", errors.NO_PERMISSION))
    agent.tick()
    assert _value(agent, "gpupack_pod_gpu_use_attributed", "a") is None
    with pytest.raises(NvmlError):  # the fault is still pending: the agent made no per-process read
        sim.process_utilization(0, 0)


def test_pods_of_a_node_playing_a_usage_trace_show_the_traces_use(tmp_path: Path) -> None:
    # Through the agent's own sampler and attribution: pod a plays p-x, pod b p-y (mapped by pod name).
    trace = load_usage_trace(write_usage_trace(tmp_path / "t", {
        "p-x": [(12.0, 3 * GIB), (47.0, 5 * GIB)],
        "p-y": [(0.0, 2 * GIB), (33.5, 4 * GIB)],
    }))
    agent, sim, _kube = _shared_node(tmp_path)
    now = _Now()
    sim.clock = now
    sim.play_trace(trace, 60.0, now.t, pods={"ml/a": "p-x", "ml/b": "p-y"})
    seen = []
    for _ in range(2):
        agent.tick()
        seen.append([(_value(agent, "DCGM_FI_DEV_GPU_UTIL", pod), _value(agent, "DCGM_FI_DEV_FB_USED", pod))
                     for pod in ("a", "b")])
        now.t += 1.0  # one trace minute
    assert seen == [[(12.0, 3072.0), (0.0, 2048.0)], [(47.0, 5120.0), (33.5, 4096.0)]]
    assert _value(agent, "gpupack_pod_gpu_use_attributed", "b") == 1.0


def test_a_pod_holding_a_whole_gpu_shows_its_trace_pods_use_through_the_devices_counters(tmp_path: Path) -> None:
    trace = load_usage_trace(write_usage_trace(tmp_path / "t", {"p": [(64.0, 9 * GIB), (8.0, 9 * GIB)]}))
    kube = FakeKube("n1")
    sim = simulated_backend("T4", 1, tmp_path / "s.json", "n1")
    now = _Now()
    sim.clock = now
    sim.play_trace(trace, 60.0, now.t)  # the one pod takes p, the first trace pod to appear
    settings = AgentSettings(node_name="n1", simulate="T4:1", emulate_device_plugin=True, min_patch_seconds=0.1,
                             metrics_port=0)
    agent = Agent(settings, sim, kube, clock=Clock())  # type: ignore[arg-type]
    kube.pods = [_pod("a", WHOLE_RESOURCE)]
    agent.tick()
    agent.tick()
    assert (_value(agent, "DCGM_FI_DEV_GPU_UTIL", "a"), _value(agent, "DCGM_FI_DEV_FB_USED", "a")) == (64.0, 9216.0)
    now.t += 1.0
    agent.tick()
    assert _value(agent, "DCGM_FI_DEV_GPU_UTIL", "a") == 8.0


class _Now:
    """The simulated backend's clock, moved by the test (at scale 60, a second is a trace minute)."""

    def __init__(self) -> None:
        self.t = 3_000_000.0

    def __call__(self) -> float:
        return self.t


class _Wall:
    """A clock that moves only when the agent sleeps."""

    def __init__(self) -> None:
        self.t = 1_000_000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds


def test_use_is_sampled_between_ticks_when_asked(tmp_path: Path) -> None:
    agent, sim, _kube = _shared_node(tmp_path, usage_sample_seconds=0.2)
    wall = _Wall()
    agent.clock, agent.sleep = wall, wall.sleep
    pid = sim_pid("uid-a")
    history = agent.usage.pods[next(k for k in agent.usage.pods if k[0] == "ml/a")].history
    samples = history.samples
    sim.set_process_memory(0, pid, 3000)  # a peak that comes and goes between two ticks
    agent._sampling_wait(0.5, lambda: False)
    sim.set_process_memory(0, pid, 1024)
    assert wall.sleeps == [0.2, 0.2, pytest.approx(0.1)]  # sampled at 0.2 and 0.4; the tick at 0.5 samples itself
    history = agent.usage.pods[next(k for k in agent.usage.pods if k[0] == "ml/a")].history
    assert history.samples == samples + 2
    assert history.memory.peak() == 3000 * GIB // 1024


def test_a_sample_between_ticks_attributes_to_the_last_ticks_pods(tmp_path: Path) -> None:
    agent, sim, kube = _shared_node(tmp_path)
    before = {k: p.history.samples for k, p in agent.usage.pods.items()}
    kube.pods = []  # gone from the API: the sample still reads the pods of the last tick, no API call
    agent.sample_usage()
    after = {k: p.history.samples for k, p in agent.usage.pods.items()}
    assert after == {k: n + 1 for k, n in before.items()} and len(after) == 2


def test_a_negative_sample_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="usage_sample_seconds must not be negative"):
        AgentSettings(node_name="n1", usage_sample_seconds=-1.0).validate()
