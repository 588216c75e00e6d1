"""The kubelet PodResources API: which pod the device plugin gave which device.

``List`` on ``/var/lib/kubelet/pod-resources/kubelet.sock`` (gRPC, service
``v1.PodResourcesLister``) answers for every pod the kubelet admitted, without
``hostPID``. gpupack calls it through the client stub generated from the kubelet's
``api.proto`` (``node.kubeletapi.podresources_v1_pb2_grpc``, see tools/proto/generate.py)
and keeps, of each container's devices, the resource name and the device ids.

Device ids are what the NVIDIA device plugin advertises: a GPU or MIG UUID, with
``::<n>`` appended for a time-sliced or MPS replica.

Every failure (no socket, grpcio or protobuf missing or too old for the generated code,
the call failing, timing out or answering something undecodable) is a
``PodResourcesError``; the agent then falls back to what ``/proc`` says.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sharing.api.keys import NVIDIA_PREFIX

if TYPE_CHECKING:
    from node.kubeletapi.podresources_v1_pb2 import ListPodResourcesResponse

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")


class PodResourcesError(Exception):
    """The API is unreachable or answered something undecodable (the agent falls back)."""


@dataclass(frozen=True)
class PodDevices:
    namespace: str
    name: str
    resource: str
    device_ids: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def pod_devices(response: ListPodResourcesResponse) -> list[PodDevices]:
    """One entry per container device group of each pod (a pod without devices yields none)."""
    return [PodDevices(pod.namespace, pod.name, devices.resource_name, tuple(devices.device_ids))
            for pod in response.pod_resources
            for container in pod.containers
            for devices in container.devices]


def list_pod_devices(socket: Path = DEFAULT_SOCKET, timeout_s: float = 5.0) -> list[PodDevices]:
    """Call ``List``; raises ``PodResourcesError`` when the socket or grpcio is missing or the call fails."""
    if not socket.exists():
        raise PodResourcesError(f"no kubelet PodResources socket at {socket}")
    try:
        import grpc  # type: ignore[import-untyped]

        from node.kubeletapi import podresources_v1_pb2, podresources_v1_pb2_grpc
    except ImportError as exc:
        raise PodResourcesError(f"grpcio or protobuf not installed: {exc}") from exc
    except Exception as exc:  # the generated code checks the runtime versions at import
        raise PodResourcesError(f"grpcio or protobuf too old for the generated stubs: {exc}") from exc
    try:
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            stub = podresources_v1_pb2_grpc.PodResourcesListerStub(channel)
            response = stub.List(podresources_v1_pb2.ListPodResourcesRequest(), timeout=timeout_s)
    except grpc.RpcError as exc:  # also an answer the stub cannot decode (StatusCode.INTERNAL)
        raise PodResourcesError(f"PodResources List failed: {exc}") from exc
    return pod_devices(response)


def device_owners(pods: list[PodDevices]) -> dict[str, list[str]]:
    """Device UUID (replica suffix ``::n`` removed) -> ``namespace/name`` of the pods holding it."""
    owners: dict[str, list[str]] = {}
    for pod in pods:
        if not pod.resource.startswith(NVIDIA_PREFIX):
            continue
        for device in pod.device_ids:
            holders = owners.setdefault(device.split("::", 1)[0], [])
            if pod.key not in holders:
                holders.append(pod.key)
    return owners
