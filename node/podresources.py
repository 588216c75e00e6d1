"""The kubelet PodResources API: which pod the device plugin gave which device.

``List`` on ``/var/lib/kubelet/pod-resources/kubelet.sock`` (gRPC, service
``v1.PodResourcesLister``) answers for every pod the kubelet admitted, without
``hostPID``. gpupack talks to it with grpcio's generic unary call and decodes the
few fields it needs straight from the protobuf wire format (field numbers from
the kubelet's ``api.proto``), so it needs neither generated stubs nor protobuf:

    ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
    PodResources       { string name = 1; string namespace = 2; repeated ContainerResources containers = 3; }
    ContainerResources { string name = 1; repeated ContainerDevices devices = 2; ... }
    ContainerDevices   { string resource_name = 1; repeated string device_ids = 2; ... }

Device ids are what the NVIDIA device plugin advertises: a GPU or MIG UUID, with
``::<n>`` appended for a time-sliced or MPS replica.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from sharing.keys import NVIDIA_PREFIX

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
LIST_METHOD = "/v1.PodResourcesLister/List"


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


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise PodResourcesError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise PodResourcesError("varint too long")


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of one message: ints for varints, bytes for length-delimited."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, value
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise PodResourcesError("truncated field")
            yield number, data[pos: pos + length]
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise PodResourcesError(f"unsupported protobuf wire type {wire}")


def decode_list_response(data: bytes) -> list[PodDevices]:
    result: list[PodDevices] = []
    for number, pod in _fields(data):
        if number != 1 or not isinstance(pod, bytes):
            continue
        name = namespace = ""
        containers: list[bytes] = []
        for n, v in _fields(pod):
            if n == 1 and isinstance(v, bytes):
                name = v.decode()
            elif n == 2 and isinstance(v, bytes):
                namespace = v.decode()
            elif n == 3 and isinstance(v, bytes):
                containers.append(v)
        for container in containers:
            for n, device in _fields(container):
                if n != 2 or not isinstance(device, bytes):
                    continue
                resource = ""
                ids: list[str] = []
                for dn, dv in _fields(device):
                    if dn == 1 and isinstance(dv, bytes):
                        resource = dv.decode()
                    elif dn == 2 and isinstance(dv, bytes):
                        ids.append(dv.decode())
                result.append(PodDevices(namespace, name, resource, tuple(ids)))
    return result


def list_pod_devices(socket: Path = DEFAULT_SOCKET, timeout_s: float = 5.0) -> list[PodDevices]:
    """Call ``List``; raises ``PodResourcesError`` when the socket or grpcio is missing or the call fails."""
    if not socket.exists():
        raise PodResourcesError(f"no kubelet PodResources socket at {socket}")
    try:
        import grpc  # type: ignore[import-untyped]
    except ImportError as exc:
        raise PodResourcesError(f"grpcio not installed: {exc}") from exc
    try:
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            call = channel.unary_unary(LIST_METHOD)  # no (de)serializers: raw protobuf bytes both ways
            response = call(b"", timeout=timeout_s)
    except grpc.RpcError as exc:
        raise PodResourcesError(f"PodResources List failed: {exc}") from exc
    return decode_list_response(bytes(response))


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
