"""What the plugin tells the kubelet about its devices' health (``v1.DRAResourceHealth``): pure.

The kubelet (feature gate ``ResourceHealthStatus``) opens one ``NodeWatchResources``
stream per plugin and shows each allocated device's health in the pod's status
(``containerStatuses[].allocatedResourcesStatus``), so a user sees that the GPU
their pod runs on has failed. Each message on the stream is the complete list;
a device the kubelet has not heard of within the device's timeout reads
``Unknown`` (``pkg/kubelet/cm/dra/healthinfo.go``, default 30 s), so the plugin
sends the list again at every interval, changed or not.

The plugin does not watch the GPUs itself. The node agent does (``node.health``:
XIDs, ECC errors, lost GPUs) and writes each fault into its GPUNode's status;
the plugin reads that status through the one reader of it
(``sharing.api.gpunode.read_gpunode``), so a fault has one meaning for the agent's
ResourceSlices (the device is withdrawn: no new claim gets it), the controller
and the kubelet (the claims that hold it are told).

**Which devices**: those of the claims the plugin has prepared (its journal,
phase ``Prepared``): the devices the kubelet has given to containers, the only
ones it shows a health for. A claim being prepared joins at the next message.

**Each device's health** (:func:`device_health`):

* ``Unhealthy``: its GPU has a fault, or (a MIG device) the instance at its
  placement has one; the message is the fault's reason and text;
* ``Unknown``: the node's GPUNode cannot be read, does not exist, or its
  heartbeat is older than ``stale_after_s`` (the agent has stopped: its
  silence is not health), or the status lists no such GPU;
* ``Healthy`` otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from kube.times import seconds_since
from node.draplugin.journal import DeviceRecord
from sharing.api.crd import DeviceHealth
from sharing.api.gpunode import GpuNodeReading, GpuReading, read_gpunode

Health = Literal["Healthy", "Unhealthy", "Unknown"]
MAX_MESSAGE: Final = 1024
"""The kubelet keeps at most this many characters of a device's message (it cuts longer ones)."""


@dataclass(frozen=True)
class NodeHealthView:
    """The node's GPUs as its agent last reported them, or why they cannot be known."""

    reading: GpuNodeReading | None
    unknown_because: str = ""
    """Set exactly when ``reading`` is None."""


@dataclass(frozen=True)
class DeviceHealthReport:
    pool: str
    device: str
    health: Health
    message: str = ""


def node_view(obj: Mapping[str, Any] | None, node: str, now: datetime, stale_after_s: float) -> NodeHealthView:
    """The view from the node's GPUNode object (None: there is none); ``now`` is aware."""
    if obj is None:
        return NodeHealthView(None, f"there is no GPUNode {node}: the node agent has not reported this node")
    reading = read_gpunode(obj)
    if reading is None:
        return NodeHealthView(None, f"GPUNode {node} has no name; it cannot be read")
    silent = seconds_since(reading.heartbeat, now)
    if silent is not None and silent > stale_after_s:
        return NodeHealthView(None, f"the node agent last reported at {reading.heartbeat}, more than "
                                    f"{stale_after_s:.0f} s ago: it may have stopped")
    return NodeHealthView(reading)


def unreadable(node: str, problem: str) -> NodeHealthView:
    return NodeHealthView(None, f"GPUNode {node} could not be read: {problem}")


def device_health(records: Iterable[DeviceRecord], view: NodeHealthView) -> list[DeviceHealthReport]:
    """One report per device of ``records`` (a device listed twice is reported once), in order."""
    gpus = {g.index: g for g in view.reading.gpus} if view.reading is not None else {}
    out: list[DeviceHealthReport] = []
    seen: set[tuple[str, str]] = set()
    for record in records:
        key = (record.pool, record.device)
        if key in seen:
            continue
        seen.add(key)
        health, message = _one(record, view, gpus.get(record.gpu))
        out.append(DeviceHealthReport(record.pool, record.device, health, message[:MAX_MESSAGE]))
    return out


def _one(record: DeviceRecord, view: NodeHealthView, gpu: GpuReading | None) -> tuple[Health, str]:
    if view.reading is None:
        return "Unknown", view.unknown_because
    if gpu is None:
        return "Unknown", f"GPU {record.gpu} is not in GPUNode {view.reading.name}'s status"
    if gpu.health is not None:
        return "Unhealthy", _fault(f"GPU {record.gpu}", gpu.health)
    if record.placement is not None:  # a MIG device, or a whole GPU in MIG mode: its instance
        for instance in gpu.instances:
            if (instance.health is not None and instance.profile == record.profile
                    and instance.start == record.placement.start):
                return "Unhealthy", _fault(f"MIG {record.profile} at slice {instance.start} of GPU {record.gpu}",
                                           instance.health)
    return "Healthy", ""


def _fault(what: str, fault: DeviceHealth) -> str:
    return f"{what}: {fault.reason}: {fault.message}"
