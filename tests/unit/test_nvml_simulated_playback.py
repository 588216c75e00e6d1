"""The simulated NVML playing a usage trace: processes bound in order of appearance or by their pod,
SM load and memory following the trace at the scaled time, memory held to what the device has
(growths that do not fit are counted), an MPS client held to its pinned memory limit, the end of a
trace pod, and a restart on the same state file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupack.cli import load_usage_trace
from gpupack.testing.usage_traces import GIB, write_usage_trace
from mig.catalog import get_model
from mig.model import Placement
from node.nvml.simulated import MPS_SERVER_PID_BASE, SimulatedNvml, simulated_backend
from sharing.api.mps_env import PINNED_MEMORY_ENV, MpsEnvError
from sharing.usage.trace import UsageTrace

START = 2_000_000.0
MIB = 2**20


class Now:
    """The backend's clock, moved by the test: one second is one trace step at scale 60."""

    def __init__(self) -> None:
        self.t = START

    def __call__(self) -> float:
        return self.t


def _playing(sim: SimulatedNvml, trace: UsageTrace, **kwargs: object) -> Now:
    now = Now()
    sim.clock = now
    sim.play_trace(trace, 60.0, START, **kwargs)  # type: ignore[arg-type]
    return now


def _state(sim: SimulatedNvml, gpu: int) -> list[tuple[int, float, int]]:
    """(pid, SM %, memory MiB) of GPU ``gpu``'s processes, after a snapshot begins (as the agent's do)."""
    sim.device_count()
    sm = {s.pid: s.sm_percent for s in sim.process_utilization(gpu, 0)}
    return [(p.pid, sm.get(p.pid, 0.0), p.used_memory_mib) for p in sim.processes(gpu)]


def test_processes_play_trace_pods_in_order_of_appearance(tmp_path: Path) -> None:
    trace = load_usage_trace(write_usage_trace(tmp_path / "t", {
        "p-a": [(10.0, 1 * GIB), (20.0, 2 * GIB)],
        "p-b": [(30.0, 3 * GIB), (40.0, 4 * GIB), (50.0, 5 * GIB)],
    }))
    sim = simulated_backend("T4", 2)
    now = _playing(sim, trace)
    sim.start_process(0, 101)
    sim.device_count()
    sim.start_process(1, 102)
    sim.device_count()
    sim.start_process(0, 103)  # every trace pod is played: the least played, first in order
    assert _state(sim, 0) == [(101, 10.0, 1024), (103, 10.0, 1024)]
    assert _state(sim, 1) == [(102, 30.0, 3072)]
    util = sim.utilization(0)
    assert (util.gpu_percent, util.memory_used_mib) == (20.0, 2048)  # the GPU is busy with both

    now.t += 1.0  # one trace minute later
    assert _state(sim, 0) == [(101, 20.0, 2048), (103, 20.0, 2048)]
    assert _state(sim, 1) == [(102, 40.0, 4096)]

    now.t += 1.0  # p-a has ended: its processes idle, holding their last memory; p-b plays on
    assert _state(sim, 0) == [(101, 0.0, 2048), (103, 0.0, 2048)]
    assert _state(sim, 1) == [(102, 50.0, 5120)]
    assert sim.utilization(0).gpu_percent == 0.0


def test_an_explicit_mapping_binds_a_process_by_its_pod(tmp_path: Path) -> None:
    trace = load_usage_trace(write_usage_trace(tmp_path / "t", {
        "p-a": [(10.0, GIB)] * 2, "p-b": [(30.0, 3 * GIB)] * 2}))
    sim = simulated_backend("T4", 1)
    _playing(sim, trace, pods={"ml/b": "p-b"})
    sim.start_process(0, 7, owner="ml/b")
    sim.start_process(0, 8, owner="ml/other")
    sim.start_process(0, 9)
    assert _state(sim, 0) == [(7, 30.0, 3072), (8, 10.0, 1024), (9, 10.0, 1024)]


def test_memory_growth_that_does_not_fit_is_held_back_and_counted_once_per_episode(tmp_path: Path) -> None:
    # A T4 has 16384 MiB; p-a grows past what p-b leaves it, shrinks, and grows past it again.
    trace = load_usage_trace(write_usage_trace(tmp_path / "t", {
        "p-a": [(5.0, 10 * GIB), (5.0, 12 * GIB), (5.0, 12 * GIB), (5.0, 4 * GIB), (5.0, 12 * GIB)],
        "p-b": [(5.0, 6 * GIB)] * 5,
    }))
    sim = simulated_backend("T4", 1)
    now = _playing(sim, trace)
    sim.start_process(0, 1)
    sim.start_process(0, 2)
    seen = []
    for _ in range(5):
        seen.append([mib for _pid, _sm, mib in _state(sim, 0)])
        assert sim.utilization(0).memory_used_mib <= sim.device_info(0).memory_total_mib
        now.t += 1.0
    assert seen == [[10240, 6144], [10240, 6144], [10240, 6144], [4096, 6144], [10240, 6144]]
    assert sim.memory_limit_hits(0) == {1: 2, 2: 0}


def test_a_process_in_a_mig_instance_holds_at_most_the_instances_memory(tmp_path: Path) -> None:
    trace = load_usage_trace(write_usage_trace(tmp_path / "t", {"p": [(50.0, 20 * GIB)] * 2}))
    h200 = get_model("H200")
    sim = SimulatedNvml(h200, 1)
    gi = sim.create_gpu_instance(0, h200.profile("1g.18gb").profile_id, Placement(0, 1))
    _playing(sim, trace)
    sim.start_process(0, 5, gi_id=gi.gi_id)
    sim.device_count()
    (proc,) = sim.processes(0)
    assert proc.used_memory_mib == h200.profile("1g.18gb").memory_mib
    assert sim.memory_limit_hits(0) == {5: 1}


def test_a_restarted_backend_goes_on_with_the_same_timeline_and_bindings(tmp_path: Path) -> None:
    trace = load_usage_trace(write_usage_trace(tmp_path / "t", {
        "p-a": [(10.0, 1 * GIB), (20.0, 2 * GIB)], "p-b": [(30.0, 3 * GIB), (40.0, 4 * GIB)]}))
    state = tmp_path / "s.json"
    first = simulated_backend("T4", 1, state)
    first.clock = Now()
    assert first.play_trace(trace, 60.0).start_s == START  # no start given: now
    first.start_process(0, 1)
    first.start_process(0, 2)
    first.device_count()  # 1 plays p-a, 2 plays p-b
    first.stop_process(0, 1)

    again = simulated_backend("T4", 1, state)
    now = Now()
    now.t += 1.0
    again.clock = now
    assert again.play_trace(trace, 60.0).start_s == START  # kept in the state file
    again.start_process(0, 3)  # takes p-a, the trace pod no process plays
    assert _state(again, 0) == [(2, 40.0, 4096), (3, 20.0, 2048)]


def _memory(sim: SimulatedNvml, gpu: int) -> dict[int, int]:
    """pid -> MiB of GPU ``gpu``'s workload processes (not the MPS server), after a snapshot begins."""
    sim.device_count()
    return {p.pid: p.used_memory_mib for p in sim.processes(gpu) if p.pid != MPS_SERVER_PID_BASE + gpu}


LIMITED = {PINNED_MEMORY_ENV: "0=4096M"}
GROWING = {"p": [(5.0, 2 * GIB), (5.0, 3 * GIB), (5.0, 6 * GIB), (5.0, 8 * GIB), (5.0, 2 * GIB), (5.0, 5 * GIB)]}
"""Under a 4 GiB limit: grows within it, past it (an episode that lasts two steps), shrinks, past it again."""


def _walk(sim: SimulatedNvml, now: Now, steps: int, gpu: int = 0) -> list[dict[int, int]]:
    seen = []
    for _ in range(steps):
        seen.append(_memory(sim, gpu))
        now.t += 1.0
    return seen


def test_an_mps_client_grows_within_its_limit_and_no_further(tmp_path: Path) -> None:
    sim = simulated_backend("T4", 1)
    sim.set_mps(0, True)
    now = _playing(sim, load_usage_trace(write_usage_trace(tmp_path / "t", GROWING)))
    sim.start_process(0, 1, env=LIMITED)
    assert _walk(sim, now, 6) == [{1: 2048}, {1: 3072}, {1: 4096}, {1: 4096}, {1: 2048}, {1: 4096}]
    assert sim.memory_limit_hits(0) == {1: 2}  # one per episode, the device far from full


def test_the_daemons_default_narrows_the_clients_limit(tmp_path: Path) -> None:
    # The device plugin's daemon sets 3 GiB per client; a client's own 4 GiB cannot widen it, and a
    # client that sets none is held to it too.
    sim = simulated_backend("T4", 1)
    sim.set_mps(0, True, default_limit_mib=3072)
    trace = load_usage_trace(write_usage_trace(tmp_path / "t", {"p": [(5.0, 6 * GIB)] * 2, "q": [(5.0, 6 * GIB)] * 2}))
    _playing(sim, trace)
    sim.start_process(0, 1, env=LIMITED)
    sim.start_process(0, 2)
    assert _memory(sim, 0) == {1: 3072, 2: 3072}


def test_the_limit_is_kept_in_the_state_file(tmp_path: Path) -> None:
    trace = load_usage_trace(write_usage_trace(tmp_path / "t", GROWING))
    state = tmp_path / "s.json"
    first = simulated_backend("T4", 1, state)
    first.set_mps(0, True)
    first.clock = Now()
    first.start_process(0, 1, env=LIMITED)

    again = simulated_backend("T4", 1, state)
    again.set_mps(0, False)  # the daemon stops: a client keeps the limit it started with
    now = _playing(again, trace)
    now.t += 2.0  # the step that wants 6 GiB
    assert _memory(again, 0) == {1: 4096}
    assert again.memory_limit_hits(0) == {1: 1}


@pytest.mark.parametrize("mps", [False, True], ids=["time-slicing-or-whole", "mps-daemon-off-then-on"])
def test_a_process_started_without_mps_has_no_limit(tmp_path: Path, mps: bool) -> None:
    # Without an MPS daemon CUDA ignores the variable; a client's limit is fixed at its start, so a
    # daemon started later does not limit it either.
    sim = simulated_backend("T4", 1)
    now = _playing(sim, load_usage_trace(write_usage_trace(tmp_path / "t", GROWING)))
    sim.start_process(0, 1, env=LIMITED)
    sim.set_mps(0, mps)
    assert _walk(sim, now, 4) == [{1: 2048}, {1: 3072}, {1: 6144}, {1: 8192}]
    assert sim.memory_limit_hits(0) == {1: 0}


def test_a_mig_instance_bounds_memory_not_an_mps_limit(tmp_path: Path) -> None:
    trace = load_usage_trace(write_usage_trace(tmp_path / "t", {"p": [(50.0, 20 * GIB)] * 2}))
    h200 = get_model("H200")
    sim = SimulatedNvml(h200, 1)
    sim.set_mps(0, True)
    gi = sim.create_gpu_instance(0, h200.profile("3g.71gb").profile_id, Placement(0, 4))
    _playing(sim, trace)
    sim.start_process(0, 5, gi_id=gi.gi_id, env=LIMITED)
    assert _memory(sim, 0) == {5: 20 * 1024}
    assert sim.memory_limit_hits(0) == {5: 0}


def test_a_malformed_limit_refuses_the_start_naming_the_value() -> None:
    sim = simulated_backend("T4", 1)
    sim.set_mps(0, True)
    with pytest.raises(MpsEnvError, match="'0=4096'"):
        sim.start_process(0, 1, env={PINNED_MEMORY_ENV: "0=4096"})
    with pytest.raises(MpsEnvError, match="'lots'"):  # on a GPU without MPS too: the same pod fails anywhere
        simulated_backend("T4", 1).start_process(0, 1, env={PINNED_MEMORY_ENV: "lots"})
    assert sim.processes(0) == ()
