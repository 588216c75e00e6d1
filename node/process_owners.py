"""Which pod owns which device: one seam, two implementations (chosen by the NVML backend).

- :class:`KubeletProcesses` (real NVML): a GPU process's pod from its cgroup in
  ``/proc``, plus the kubelet's PodResources API, which names the devices every
  admitted pod got, process or not.
- :class:`SimulatedProcesses`: the simulator's processes carry ids derived from
  the pod's uid (``node.base.pods.sim_pid``); there is no kubelet to ask.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

from node.base.snapshot import NodeSnapshot
from node.nvml.protocol import NvmlBackend
from node.nvml.simulated import SimulatedNvml
from node.podresources import PodResourcesError, device_owners, list_pod_devices
from node.base.pods import PodUse, pod_uid_of_pid, pods_by_device, pods_by_pid, sim_pid
from node.base.settings import AgentSettings

log = logging.getLogger("gpupack.agent")

PodMap = tuple[dict[str, list[str]], list[PodUse]]
"""Pods (``namespace/name``) per device UUID, and the pod uses no device was found for."""


class ProcessOwners(Protocol):
    def pods_by_device(self, snapshot: NodeSnapshot, uses: list[PodUse]) -> PodMap: ...

    def pods_by_pid(self, snapshot: NodeSnapshot, uses: list[PodUse]) -> dict[int, str]:
        """The pod (``namespace/name``) of each GPU process whose pod is known: how the use of a shared
        GPU is split between its pods (``node.usage``)."""
        ...


class SimulatedProcesses:
    def pods_by_device(self, snapshot: NodeSnapshot, uses: list[PodUse]) -> PodMap:
        return pods_by_device(snapshot, uses, self._uid_of_pid(uses))

    def pods_by_pid(self, snapshot: NodeSnapshot, uses: list[PodUse]) -> dict[int, str]:
        return pods_by_pid(uses, self._uid_of_pid(uses))

    @staticmethod
    def _uid_of_pid(uses: list[PodUse]) -> dict[int, str]:
        return {sim_pid(u.uid, o): u.uid for u in uses for o in range(u.count)}


class KubeletProcesses:
    def __init__(self, pod_resources_socket: str) -> None:
        self.socket = Path(pod_resources_socket)

    def pods_by_pid(self, snapshot: NodeSnapshot, uses: list[PodUse]) -> dict[int, str]:
        return pods_by_pid(uses, self._uid_of_pid(snapshot))

    @staticmethod
    def _uid_of_pid(snapshot: NodeSnapshot) -> dict[int, str]:
        """Pod uid of each GPU process, from its cgroup in ``/proc`` (needs ``hostPID``)."""
        uid_of_pid = {}
        for gpu in snapshot.gpus:
            for proc in gpu.processes:
                uid = pod_uid_of_pid(proc.pid)
                if uid:
                    uid_of_pid[proc.pid] = uid
        return uid_of_pid

    def pods_by_device(self, snapshot: NodeSnapshot, uses: list[PodUse]) -> PodMap:
        by_device, unresolved = pods_by_device(snapshot, uses, self._uid_of_pid(snapshot))
        try:
            owners = device_owners(list_pod_devices(self.socket))
        except PodResourcesError as exc:
            log.debug("PodResources API not used: %s", exc)
            return by_device, unresolved
        # The kubelet knows which device each admitted pod got, process or not.
        for device, keys in owners.items():
            holders = by_device.setdefault(device, [])
            holders.extend(k for k in keys if k not in holders)
        known = {k for keys in owners.values() for k in keys}
        return by_device, [u for u in unresolved if u.key not in known]


def process_owners_for(backend: NvmlBackend | None, settings: AgentSettings) -> ProcessOwners:
    """The simulator's ids on a simulated backend, the kubelet's view otherwise."""
    if isinstance(backend, SimulatedNvml):
        return SimulatedProcesses()
    return KubeletProcesses(settings.pod_resources_socket)
