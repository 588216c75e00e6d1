"""The device health the plugin streams to the kubelet (``v1.DRAResourceHealth``): which devices,
what each one's health is from the agent's GPUNode, and the stream's life (``node.draplugin.health``,
``gpunode_source``, ``service.HealthService``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from mig.model import Placement
from node.draplugin.claims import ClaimRef
from node.draplugin.gpunode_source import FileGpuNodeSource, GpuNodeUnreadable, look
from node.draplugin.health import NodeHealthView, device_health, node_view
from node.draplugin.journal import ClaimRecord, DeviceRecord
from node.draplugin.service import HEALTH_SERVICE_VERSION, MAX_HEALTH_STREAMS, HealthService, RegistrationService
from node.kubeletapi import dra_health_v1_pb2 as dra_health

NODE = "node-a"
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)
STALE_S = 180.0


def fault(reason: str = "Xid79", message: str = "GPU has fallen off the bus") -> dict[str, Any]:
    return {"reason": reason, "message": message, "since": "2026-12-02T11:59:00Z", "recovery": "RebootNode"}


def gpunode(gpus: list[dict[str, Any]], heartbeat: datetime = NOW) -> dict[str, Any]:
    return {"apiVersion": "gpupack.io/v1alpha1", "kind": "GPUNode", "metadata": {"name": NODE},
            "status": {"product": "NVIDIA-H100-80GB-HBM3", "heartbeatTime": heartbeat.isoformat(), "gpus": gpus}}


def gpu(index: int, *, health: dict[str, Any] | None = None, instances: list[dict[str, Any]] | None = None,
        mig: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"index": index, "memoryMiB": 81559, "migEnabled": mig, "instances": instances or []}
    if health is not None:
        out["health"] = health
    return out


def shared(index: int) -> DeviceRecord:
    return DeviceRecord(request="gpu-0", pool=NODE, device=f"gpu-{index}-shared", kind="shared", gpu=index,
                        gpu_uuid=f"GPU-{index}")


def mig(index: int, profile: str, start: int, size: int) -> DeviceRecord:
    return DeviceRecord(request="gpu-0", pool=NODE, device=f"gpu-{index}-mig-{profile.replace('.', '-')}-{start}",
                        kind="mig", gpu=index, gpu_uuid=f"GPU-{index}", profile=profile, profile_id=9,
                        placement=Placement(start, size), gi_id=3, uuid=f"MIG-{index}-{start}", created=True)


def view(obj: Mapping[str, Any] | None) -> NodeHealthView:
    return node_view(obj, NODE, NOW, STALE_S)


def healths(records: list[DeviceRecord], obj: Mapping[str, Any] | None) -> dict[str, tuple[str, str]]:
    return {r.device: (r.health, r.message) for r in device_health(records, view(obj))}


# ---------------------------------------------------------------------- each device's health
def test_a_gpu_without_a_fault_is_healthy_and_a_faulted_gpu_unhealthy_with_the_agents_reason() -> None:
    obj = gpunode([gpu(0), gpu(1, health=fault())])
    got = healths([shared(0), shared(1)], obj)
    assert got["gpu-0-shared"] == ("Healthy", "")
    health, message = got["gpu-1-shared"]
    assert health == "Unhealthy"
    assert "GPU 1" in message and "Xid79" in message and "fallen off the bus" in message


def test_a_mig_device_follows_the_instance_at_its_own_placement_and_its_gpu() -> None:
    instances = [{"profile": "3g.40gb", "start": 0, "size": 4, "inUse": True, "health": fault("EccUncorrectable", "x")},
                 {"profile": "3g.40gb", "start": 4, "size": 4, "inUse": True}]
    obj = gpunode([gpu(0, mig=True, instances=instances), gpu(1, mig=True, health=fault())])
    got = healths([mig(0, "3g.40gb", 0, 4), mig(0, "3g.40gb", 4, 4), mig(1, "1g.10gb", 2, 1)], obj)
    assert got["gpu-0-mig-3g-40gb-0"][0] == "Unhealthy" and "EccUncorrectable" in got["gpu-0-mig-3g-40gb-0"][1]
    assert got["gpu-0-mig-3g-40gb-4"] == ("Healthy", "")  # the other instance's fault is not this one's
    assert got["gpu-1-mig-1g-10gb-2"][0] == "Unhealthy"   # the whole GPU's fault is every instance's


def test_an_instance_fault_of_another_profile_at_the_same_start_is_not_this_devices() -> None:
    instances = [{"profile": "1g.10gb", "start": 0, "size": 1, "inUse": True, "health": fault()}]
    got = healths([mig(0, "3g.40gb", 0, 4)], gpunode([gpu(0, mig=True, instances=instances)]))
    assert got["gpu-0-mig-3g-40gb-0"] == ("Healthy", "")


@pytest.mark.parametrize("obj, why", [
    (None, "there is no GPUNode node-a"),
    (gpunode([gpu(0)], heartbeat=NOW - timedelta(seconds=STALE_S + 1)), "may have stopped"),
    ({"metadata": {}}, "has no name"),
])
def test_without_a_fresh_report_every_device_is_unknown_and_says_why(obj: Mapping[str, Any] | None, why: str) -> None:
    got = healths([shared(0), mig(0, "1g.10gb", 0, 1)], obj)
    assert {h for h, _ in got.values()} == {"Unknown"}
    assert all(why in message for _, message in got.values())


def test_a_heartbeat_just_inside_the_limit_is_fresh() -> None:
    got = healths([shared(0)], gpunode([gpu(0)], heartbeat=NOW - timedelta(seconds=STALE_S - 1)))
    assert got["gpu-0-shared"] == ("Healthy", "")


def test_a_gpu_missing_from_the_status_is_unknown_and_a_device_listed_twice_is_reported_once() -> None:
    reports = device_health([shared(3), shared(0), shared(0)], view(gpunode([gpu(0)])))
    assert [(r.device, r.health) for r in reports] == [("gpu-3-shared", "Unknown"), ("gpu-0-shared", "Healthy")]
    assert "GPU 3 is not in GPUNode node-a" in reports[0].message


def test_an_unreadable_health_entry_makes_the_device_unhealthy_not_healthy() -> None:
    got = healths([shared(0)], gpunode([gpu(0, health={"reason": "not a valid reason!"})]))
    assert got["gpu-0-shared"][0] == "Unhealthy"
    assert "Unreadable" in got["gpu-0-shared"][1]


def test_a_long_message_is_cut_to_what_the_kubelet_keeps() -> None:
    got = healths([shared(0)], gpunode([gpu(0, health=fault(message="m" * 1024))]))
    assert len(got["gpu-0-shared"][1]) == 1024


# ---------------------------------------------------------------------- the file source
def test_the_file_source_reads_the_object_and_refuses_another_nodes_or_a_broken_file(tmp_path: Path) -> None:
    path = tmp_path / "gpunode.yaml"
    source = FileGpuNodeSource(path)
    assert source.read(NODE) is None  # no file yet: no GPUNode
    path.write_text("metadata: {name: node-b}\n")
    with pytest.raises(GpuNodeUnreadable, match="node-b"):
        source.read(NODE)
    path.write_text("{not: yaml: at all")
    outcome = look(source, NODE, NOW, STALE_S)
    assert outcome.reading is None and "could not be read" in outcome.unknown_because
    path.write_text("- a list\n")
    with pytest.raises(GpuNodeUnreadable, match="does not hold an object"):
        source.read(NODE)


# ---------------------------------------------------------------------- the stream
class Preparer:
    def __init__(self, records: Mapping[str, ClaimRecord]) -> None:
        self.records = records


class Context:
    """The parts of a grpc ServicerContext the stream uses."""

    def __init__(self) -> None:
        self.active = True
        self.callbacks: list[Callable[[], None]] = []
        self.aborted: tuple[Any, str] | None = None

    def add_callback(self, callback: Callable[[], None]) -> bool:
        self.callbacks.append(callback)
        return True

    def is_active(self) -> bool:
        return self.active

    def abort(self, code: Any, details: str) -> None:
        self.aborted = (code, details)
        raise RuntimeError(details)

    def cancel(self) -> None:
        self.active = False
        for callback in self.callbacks:
            callback()


def record(uid: str, phase: Any, *devices: DeviceRecord) -> ClaimRecord:
    return ClaimRecord(ClaimRef(uid, "ml", f"claim-{uid}"), phase, devices, started_at=0.0, updated_at=0.0)


def health_service(records: Mapping[str, ClaimRecord], obj: Mapping[str, Any] | None,
                   looks: list[int] | None = None) -> HealthService:
    def look_now() -> NodeHealthView:
        if looks is not None:
            looks.append(1)
        return view(obj)

    return HealthService(Preparer(records), look_now, interval_s=10.0, clock=lambda: 1_800_000_000.5)  # type: ignore[arg-type]


def test_a_message_lists_the_devices_of_prepared_claims_only_with_time_and_timeout() -> None:
    records = {"a": record("a", "Prepared", shared(0)), "b": record("b", "Preparing", shared(1)),
               "c": record("c", "Unpreparing", shared(2))}
    message = health_service(records, gpunode([gpu(0), gpu(1), gpu(2)])).message()
    assert [(d.device.pool_name, d.device.device_name) for d in message.devices] == [(NODE, "gpu-0-shared")]
    (device,) = message.devices
    assert device.health == dra_health.HEALTHY
    assert device.last_updated_time == 1_800_000_000
    assert device.health_check_timeout_seconds == 30  # three intervals


def test_with_no_prepared_claim_the_gpunode_is_not_read() -> None:
    looks: list[int] = []
    message = health_service({}, gpunode([gpu(0)]), looks).message()
    assert list(message.devices) == [] and looks == []


def test_the_stream_sends_at_once_and_ends_when_the_kubelet_cancels_or_the_plugin_closes() -> None:
    service = health_service({"a": record("a", "Prepared", shared(0))}, gpunode([gpu(0, health=fault())]))
    context = Context()
    stream = service.NodeWatchResources(dra_health.NodeWatchResourcesRequest(), context)
    first = next(stream)
    assert first.devices[0].health == dra_health.UNHEALTHY
    context.cancel()  # wakes the wait: no interval passes
    assert list(stream) == []

    other = Context()
    stream = service.NodeWatchResources(dra_health.NodeWatchResourcesRequest(), other)
    next(stream)
    finished = threading.Event()

    def drain() -> None:
        list(stream)
        finished.set()

    worker = threading.Thread(target=drain)
    worker.start()
    service.close()
    worker.join(timeout=30)
    assert finished.is_set()
    with pytest.raises(RuntimeError, match="stopping"):
        next(service.NodeWatchResources(dra_health.NodeWatchResourcesRequest(), Context()))


def test_more_streams_than_the_limit_are_refused() -> None:
    service = health_service({}, None)
    streams = [service.NodeWatchResources(dra_health.NodeWatchResourcesRequest(), Context())
               for _ in range(MAX_HEALTH_STREAMS)]
    for stream in streams:
        next(stream)
    extra = Context()
    with pytest.raises(RuntimeError, match="health streams are open"):
        next(service.NodeWatchResources(dra_health.NodeWatchResourcesRequest(), extra))
    assert extra.aborted is not None and extra.aborted[0].name == "RESOURCE_EXHAUSTED"


def test_registration_offers_the_health_service_only_when_it_is_served(tmp_path: Path) -> None:
    with_health = RegistrationService(tmp_path / "dra.sock", health=True).GetInfo(None, None)  # type: ignore[arg-type]
    without = RegistrationService(tmp_path / "dra.sock").GetInfo(None, None)  # type: ignore[arg-type]
    assert list(with_health.supported_versions) == ["v1.DRAPlugin", HEALTH_SERVICE_VERSION]
    assert list(without.supported_versions) == ["v1.DRAPlugin"]
