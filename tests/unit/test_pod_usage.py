"""Per-pod GPU use (node.usage): attribution of one poll, and the per-process sampler.

Polls are read from the simulated NVML (``read_snapshot``), so the devices, instances
and processes are what the agent would see; pods and owners are given per case.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pytest

from mig.catalog import get_model
from mig.model import Placement
from node.base.dcgm import Activity
from node.base.pods import PodUse, sim_pid
from node.base.snapshot import read_snapshot
from node.metrics import AgentMetrics
from node.nvml import errors
from node.nvml.errors import NvmlError
from node.nvml.protocol import ProcessSample
from node.nvml.simulated import Fault, SimulatedNvml
from node.process_owners import SimulatedProcesses
from node.usage.attribution import PodGpuUse, Poll, SampleRead, attribute
from node.usage.sampler import ProcessSampler
from sharing.api.keys import SHARED_RESOURCE, WHOLE_RESOURCE

H200 = get_model("H200")


def _use(pod: str, resource: str, *containers: str) -> PodUse:
    return PodUse(pod, f"uid-{pod}", resource, 1, containers or ("main",))


def _poll(sim: SimulatedNvml, uses: list[PodUse], *, by_device: Mapping[str, list[str]] | None = None,
          samples: Mapping[int, SampleRead] | None = None, activity: Activity | None = None) -> tuple[PodGpuUse, ...]:
    """Attribute one poll of ``sim`` with the simulator's process owners (pids from ``sim_pid``);
    ``by_device`` adds holders no process shows (what the kubelet would say)."""
    snapshot = read_snapshot(sim, sim.kind)
    owners = SimulatedProcesses()
    found, _ = owners.pods_by_device(snapshot, uses)
    read = ProcessSampler().read(sim, snapshot) if samples is None else samples
    return attribute(Poll(snapshot, uses, {**found, **(by_device or {})}, owners.pods_by_pid(snapshot, uses), read,
                          activity))


def _plain(count: int = 1) -> SimulatedNvml:
    sim = SimulatedNvml(H200, count, mig_enabled=False)
    sim.clock = lambda: 1000.0
    return sim


def _run(sim: SimulatedNvml, use: PodUse, memory_mib: int, sm: float, gpu: int = 0, gi: int | None = None) -> int:
    pid = sim_pid(use.uid)
    sim.start_process(gpu, pid, memory_mib, gi)
    if sm and gi is None:
        sim.set_process_load(gpu, pid, sm)
    return pid


def test_a_whole_gpu_is_read_from_its_own_counters() -> None:
    sim, use = _plain(), _use("a/whole", WHOLE_RESOURCE)
    _run(sim, use, 30_000, 0.0)
    sim.set_load(0, 37.0)
    [found] = _poll(sim, [use])
    assert (found.source, found.sm_percent, found.memory_used_mib, found.attributed) == ("device", 37.0, 30_000, True)
    assert (found.namespace, found.name, found.container, found.gpu, found.gi_id) == ("a", "whole", "main", 0, None)


def test_a_shared_gpu_is_split_by_each_pods_processes() -> None:
    sim = _plain()
    busy, idle, waiting = _use("a/busy", SHARED_RESOURCE), _use("a/idle", SHARED_RESOURCE), _use("b/waiting", SHARED_RESOURCE)
    _run(sim, busy, 20_000, 45.0)
    _run(sim, idle, 10_000, 0.0)  # idle: NVML returns no sample for it
    uuid = sim.device_info(0).uuid
    found = {u.pod: u for u in _poll(sim, [busy, idle, waiting], by_device={uuid: ["a/busy", "a/idle", "b/waiting"]})}
    assert {p: (u.source, u.sm_percent, u.memory_used_mib, u.attributed) for p, u in found.items()} == {
        "a/busy": ("processes", 45.0, 20_000, True),
        "a/idle": ("processes", 0.0, 10_000, True),
        "b/waiting": ("processes", 0.0, 0, True),  # holds a replica, runs nothing yet: measured nothing
    }


def test_a_whole_gpu_two_pods_hold_is_split_by_processes_too() -> None:
    sim = _plain()
    one, two = _use("a/one", WHOLE_RESOURCE), _use("a/two", SHARED_RESOURCE)
    _run(sim, one, 1000, 10.0)
    _run(sim, two, 2000, 20.0)
    assert [(u.pod, u.source, u.sm_percent) for u in _poll(sim, [one, two])] == [
        ("a/one", "processes", 10.0), ("a/two", "processes", 20.0)]


def test_unreadable_process_samples_leave_shared_pods_unattributed() -> None:
    sim = _plain()
    pod = _use("a/p", SHARED_RESOURCE)
    _run(sim, pod, 5000, 50.0)
    [found] = _poll(sim, [pod], samples={0: "NVML_ERROR_NO_PERMISSION: x"})
    assert not found.attributed and found.sm_percent is None and found.memory_used_mib == 5000
    assert "unreadable: NVML_ERROR_NO_PERMISSION" in found.unattributed
    assert found.memory_attributed  # its own process's memory is read without the samples


def test_an_idle_process_of_no_known_pod_unattributes_only_pods_without_their_own() -> None:
    sim = _plain()
    known, unknown = _use("a/known", SHARED_RESOURCE), _use("a/unknown", SHARED_RESOURCE)
    _run(sim, known, 1000, 30.0)
    sim.start_process(0, 77, 3000)  # its cgroup could not be read: whose is it?
    uuid = sim.device_info(0).uuid
    found = {u.pod: u for u in _poll(sim, [known, unknown], by_device={uuid: ["a/known", "a/unknown"]})}
    assert found["a/known"].attributed and found["a/known"].sm_percent == 30.0
    assert not found["a/unknown"].attributed and found["a/unknown"].memory_used_mib is None
    assert "1 process(es) on GPU 0 belong to no known pod" in found["a/unknown"].unattributed
    assert found["a/unknown"].memory_unattributed == found["a/unknown"].unattributed


def test_a_busy_process_of_no_known_pod_unattributes_every_pod_sharing_the_gpu() -> None:
    sim = _plain()
    client = _use("a/client", SHARED_RESOURCE)
    _run(sim, client, 1000, 0.0)
    sim.start_process(0, 78, 500)  # as an MPS server would be, if NVML counted its clients' kernels to it
    sim.set_process_load(0, 78, 60.0)
    [found] = _poll(sim, [client])
    assert not found.attributed and found.sm_percent is None and found.memory_used_mib == 1000
    assert "belongs to no known pod used its SMs" in found.unattributed
    assert found.memory_attributed  # the client's memory is its own (NVML reports it per client)


# Compute and memory each by its own rule (the module docstring): (case, compute attributed, memory
# attributed, memory MiB). "server": a process of no known pod that used the SMs, as NVML names the MPS
# server under MPS (benchmarks/nvml_usage_check.md); "idle stranger": one that used none.
SIGNALS = [
    ("own process, nothing else", True, True, 1000),
    ("own process, samples unreadable", False, True, 1000),
    ("own process, busy server", False, True, 1000),
    ("own process, idle stranger", True, True, 1000),
    ("no process, nothing else", True, True, 0),
    ("no process, busy server", False, False, None),
    ("no process, idle stranger", False, False, None),
]


@pytest.mark.parametrize(("case", "compute", "memory", "mib"), SIGNALS, ids=[c[0] for c in SIGNALS])
def test_compute_and_memory_of_a_shared_gpu_are_attributed_each_by_its_rule(
        case: str, compute: bool, memory: bool, mib: int | None) -> None:
    sim = _plain()
    pod = _use("a/p", SHARED_RESOURCE)
    if case.startswith("own process"):
        _run(sim, pod, 1000, 20.0)
    if "server" in case or "stranger" in case:
        sim.start_process(0, 78, 66)
        sim.set_process_load(0, 78, 80.0 if "server" in case else 0.0)
    samples = {0: "NVML_ERROR_UNKNOWN: x"} if "unreadable" in case else None
    [found] = _poll(sim, [pod], by_device={sim.device_info(0).uuid: ["a/p"]}, samples=samples)
    assert (found.attributed, found.memory_attributed, found.memory_used_mib) == (compute, memory, mib)
    assert (found.sm_percent is not None) == compute


def test_memory_of_a_device_held_alone_is_the_pods_when_its_compute_is_not_read() -> None:
    sim, gi = _mig()
    pod = _use("a/mig", "nvidia.com/mig-3g.71gb")
    _run(sim, pod, 40_000, 0.0, gi=gi)
    [found] = _poll(sim, [pod])  # no dcgm-exporter: no compute, but everything on the instance is the pod's
    assert (found.attributed, found.memory_attributed, found.memory_used_mib) == (False, True, 40_000)


def test_memory_unattributed_without_compute_unattributed_is_refused() -> None:
    with pytest.raises(ValueError, match="memory unattributed .* but compute attributed"):
        PodGpuUse("a/p", "c", 0, "GPU-0", None, "processes", 10.0, None, "", "no process of its own")


def _mig() -> tuple[SimulatedNvml, int]:
    sim = SimulatedNvml(H200, 1)
    gi = sim.create_gpu_instance(0, H200.profile("3g.71gb").profile_id, Placement(4, 4))
    return sim, gi.gi_id


def test_a_mig_instance_is_read_from_dcgm_activity_and_its_processes_memory() -> None:
    sim, gi = _mig()
    pod = _use("a/mig", "nvidia.com/mig-3g.71gb")
    _run(sim, pod, 40_000, 0.0, gi=gi)
    uuid = sim.device_info(0).uuid
    [found] = _poll(sim, [pod], activity={(uuid, gi): 0.25})
    assert (found.source, found.sm_percent, found.memory_used_mib, found.gi_id, found.attributed) == (
        "instance", 25.0, 40_000, gi, True)
    [without] = _poll(sim, [pod])  # no dcgm-exporter: NVML has no utilisation in MIG mode
    assert not without.attributed and without.memory_used_mib == 40_000 and "dcgm-exporter" in without.unattributed


def test_pods_time_slicing_a_mig_instance_are_unattributed() -> None:
    sim, gi = _mig()
    one, two = _use("a/one", "nvidia.com/mig-3g.71gb"), _use("a/two", "nvidia.com/mig-3g.71gb")
    _run(sim, one, 1000, 0.0, gi=gi)
    uuid = sim.gpu_instances(0)[0].uuid
    found = _poll(sim, [one, two], by_device={uuid: ["a/one", "a/two"]}, activity={(sim.device_info(0).uuid, gi): 0.5})
    assert [(u.pod, u.attributed, u.memory_used_mib) for u in found] == [("a/one", False, 1000), ("a/two", False, 0)]
    assert all("2 pods share MIG instance" in u.unattributed for u in found)
    assert all(u.memory_attributed for u in found)  # a's process is a's; b has none, and no stranger is there


def test_a_pod_without_a_known_device_and_a_lost_gpu_are_unattributed() -> None:
    sim = _plain(2)
    lost, nowhere = _use("a/lost", WHOLE_RESOURCE), _use("a/nowhere", WHOLE_RESOURCE)
    _run(sim, lost, 1000, 5.0, gpu=1)
    sim.inject_fault(Fault("utilization", errors.GPU_IS_LOST, gpu=1))
    # A failed GPU's processes cannot be read: the pod is known to hold it from the kubelet.
    found = {u.pod: u for u in _poll(sim, [lost, nowhere], by_device={sim.device_info(1).uuid: ["a/lost"]})}
    assert not found["a/lost"].attributed and "GPU 1 unreadable" in found["a/lost"].unattributed
    assert found["a/nowhere"].gpu is None and not found["a/nowhere"].attributed
    assert not found["a/lost"].memory_attributed and not found["a/nowhere"].memory_attributed


@pytest.mark.parametrize(("containers", "expected"), [(("main",), "main"), (("main", "sidecar"), "")],
                         ids=["one-gpu-container", "several"])
def test_the_container_is_named_only_when_one_asks_for_gpus(containers: tuple[str, ...], expected: str) -> None:
    sim = _plain()
    pod = _use("a/p", WHOLE_RESOURCE, *containers)
    _run(sim, pod, 1000, 0.0)
    assert _poll(sim, [pod])[0].container == expected


# ------------------------------------------------------------------------------ sampler
class Reader:
    """A UsageReader that records what it is asked and answers from a script."""

    def __init__(self, answers: list[tuple[ProcessSample, ...] | NvmlError]) -> None:
        self.answers, self.asked = answers, []  # type: list[tuple[ProcessSample, ...] | NvmlError], list[int]

    def process_utilization(self, index: int, since_us: int) -> tuple[ProcessSample, ...]:
        self.asked.append(since_us)
        answer = self.answers.pop(0)
        if isinstance(answer, NvmlError):
            raise answer
        return answer


def test_the_sampler_asks_since_the_newest_sample_and_logs_an_error_once(caplog: pytest.LogCaptureFixture) -> None:
    sim = _plain()
    sim.start_process(0, 5, 100)
    snapshot = read_snapshot(sim, sim.kind)
    denied = NvmlError(errors.NO_PERMISSION)
    reader = Reader([(ProcessSample(5, 7_000, 10.0, 0.0), ProcessSample(5, 9_000, 20.0, 0.0)), (), denied, denied,
                     ()])
    sampler = ProcessSampler()
    with caplog.at_level(logging.INFO, logger="gpupack.agent"):
        reads = [sampler.read(reader, snapshot)[0] for _ in range(5)]
    assert reader.asked == [0, 9_000, 9_000, 9_000, 9_000]
    assert isinstance(reads[2], str) and "NO_PERMISSION" in reads[2] and reads[4] == ()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("unreadable" in m for m in messages) == 1 and sum("readable again" in m for m in messages) == 1


def test_the_sampler_skips_mig_gpus_and_gpus_without_processes() -> None:
    sim, _gi = _mig()
    plain = _plain()
    reader = Reader([])
    assert ProcessSampler().read(reader, read_snapshot(sim, sim.kind)) == {}
    assert ProcessSampler().read(reader, read_snapshot(plain, plain.kind)) == {0: ()} and reader.asked == []


# ------------------------------------------------------------------------------ metrics
def test_metrics_name_each_use_as_dcgm_exporter_does_and_drop_what_went() -> None:
    metrics = AgentMetrics()
    mig = PodGpuUse("a/mig", "main", 0, "GPU-0", 3, "instance", 25.0, 40_000)
    shared = PodGpuUse("b/shared", "", 1, "GPU-1", None, "processes", 45.0, 20_000)
    nowhere = PodGpuUse("b/nowhere", "main", None, "", None, None, None, None, "no device", "no device")
    client = PodGpuUse("b/client", "main", 1, "GPU-1", None, "processes", None, 6916, "the MPS server used the SMs")
    metrics.observe_pod_usage([mig, shared, nowhere, client])

    def value(name: str, use: PodGpuUse) -> float | None:
        labels = {"gpu": "" if use.gpu is None else str(use.gpu), "UUID": use.gpu_uuid,
                  "GPU_I_ID": "" if use.gi_id is None else str(use.gi_id), "namespace": use.namespace,
                  "pod": use.name, "container": use.container}
        return metrics.registry.get_sample_value(name, labels)

    assert value("DCGM_FI_PROF_GR_ENGINE_ACTIVE", mig) == 0.25 and value("DCGM_FI_DEV_GPU_UTIL", mig) is None
    assert value("DCGM_FI_DEV_GPU_UTIL", shared) == 45.0 and value("DCGM_FI_DEV_FB_USED", shared) == 20_000
    assert value("gpupack_pod_gpu_use_attributed", nowhere) == 0.0 and value("DCGM_FI_DEV_FB_USED", nowhere) is None
    assert value("gpupack_pod_gpu_memory_attributed", nowhere) == 0.0
    assert value("gpupack_pod_gpu_use_attributed", client) == 0.0 and value("DCGM_FI_DEV_GPU_UTIL", client) is None
    assert value("gpupack_pod_gpu_memory_attributed", client) == 1.0 and value("DCGM_FI_DEV_FB_USED", client) == 6916
    metrics.observe_pod_usage([shared])
    assert value("DCGM_FI_PROF_GR_ENGINE_ACTIVE", mig) is None and value("gpupack_pod_gpu_use_attributed", mig) is None
    assert value("DCGM_FI_DEV_GPU_UTIL", shared) == 45.0
    assert value("gpupack_pod_gpu_memory_attributed", client) is None
