"""The kubelet PodResources client: protobuf decoding and a real gRPC call over a unix socket."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest

from node.podresources import (
    LIST_METHOD, PodDevices, PodResourcesError, decode_list_response, device_owners, list_pod_devices,
)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes | str | int) -> bytes:
    if isinstance(payload, int):
        return _varint(number << 3) + _varint(payload)
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _response(pods: list[tuple[str, str, list[tuple[str, list[str]]]]]) -> bytes:
    out = b""
    for name, namespace, devices in pods:
        container = _field(1, "main") + _field(3, 4) + _field(3, 5)  # cpu_ids: varints to skip
        for resource, ids in devices:
            device = _field(1, resource) + b"".join(_field(2, i) for i in ids) + _field(3, _field(1, b"numa"))
            container += _field(2, device)
        out += _field(1, _field(1, name) + _field(2, namespace) + _field(3, container))
    return out


SAMPLE = _response([
    ("train", "ml", [("nvidia.com/mig-3g.71gb", ["MIG-aaa"])]),
    ("notebook", "ds", [("nvidia.com/gpu.shared", ["GPU-bbb::0", "GPU-bbb::3"]), ("example.com/nic", ["eth9"])]),
    ("web", "default", []),
])


def test_decode_and_owners() -> None:
    pods = decode_list_response(SAMPLE)
    assert PodDevices("ml", "train", "nvidia.com/mig-3g.71gb", ("MIG-aaa",)) in pods
    assert device_owners(pods) == {"MIG-aaa": ["ml/train"], "GPU-bbb": ["ds/notebook"]}


@pytest.mark.parametrize("garbage", [b"\x0a\xff", b"\x0a\x05ab", b"\x0f"], ids=["bad-varint", "truncated", "wire-7"])
def test_malformed_answers_are_errors_not_crashes(garbage: bytes) -> None:
    with pytest.raises(PodResourcesError):
        decode_list_response(garbage)


@pytest.fixture
def kubelet_socket() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:  # short path: unix socket names are limited to ~100 bytes
        path = Path(tmp) / "kubelet.sock"
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
        service, method = LIST_METHOD.strip("/").split("/")

        def handle(request: bytes, _context: Any) -> bytes:
            assert request == b""
            return SAMPLE

        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            service, {method: grpc.unary_unary_rpc_method_handler(handle)}),))
        server.add_insecure_port(f"unix://{path}")
        server.start()
        try:
            yield path
        finally:
            server.stop(grace=None)


def test_list_over_grpc(kubelet_socket: Path) -> None:
    pods = list_pod_devices(kubelet_socket, timeout_s=5)
    assert {p.key for p in pods} == {"ml/train", "ds/notebook"}


def test_missing_socket_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PodResourcesError, match="no kubelet PodResources socket"):
        list_pod_devices(tmp_path / "nope.sock")


def test_agent_on_a_real_node_pins_what_the_kubelet_says_a_pod_holds() -> None:
    """A GPU node (not simulated): PodResources names the pod on the 7g instance; it is not reshaped."""
    from mig.catalog import get_model
    from node.agent import Agent
    from node.nvml.simulated import SimulatedNvml
    from node.settings import AgentSettings
    from tests.unit.test_reconciler_agent import Clock, FakeKube

    h200 = get_model("H200")
    sim = SimulatedNvml(h200, 1, seed="n1")
    seven = h200.profile("7g.141gb")
    mig_uuid = sim.create_gpu_instance(0, seven.profile_id, seven.placements[0]).uuid

    class HardwareNvml:  # the same GPUs, but not the simulation class: the agent treats it as real NVML
        kind = "nvml"

        def __getattr__(self, name: str) -> Any:
            return getattr(sim, name)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.sock"
        answer = _response([("train", "ml", [("nvidia.com/mig-7g.141gb", [mig_uuid])])])
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(lambda _r, _c: answer)}),))
        server.add_insecure_port(f"unix://{path}")
        server.start()
        try:
            kube = FakeKube("n1")
            kube.pods = [{"metadata": {"namespace": "ml", "name": "train", "uid": "u-train"},
                          "spec": {"nodeName": "n1", "containers": [
                              {"resources": {"limits": {"nvidia.com/mig-7g.141gb": "1"}}}]}}]
            settings = AgentSettings(node_name="n1", idle_seconds=0.0, min_patch_seconds=0.01, metrics_port=0,
                                     pod_resources_socket=str(path))
            agent = Agent(settings, HardwareNvml(), kube, clock=Clock())  # type: ignore[arg-type]
            agent.tick()
            kube.set_spec({"gpus": [{"index": 0, "migEnabled": True, "layout": [{"profile": "1g.18gb"}] * 7}]})
            for _ in range(3):
                agent.tick()
        finally:
            server.stop(grace=None)
    assert [i.profile for i in sim.gpu_instances(0)] == ["7g.141gb"]
    assert kube.gpunode is not None
    gpu0 = kube.gpunode["status"]["gpus"][0]["instances"][0]
    assert gpu0["pods"] == ["ml/train"] and gpu0["inUse"] is True
    cond = next(c for c in kube.gpunode["status"]["conditions"] if c["type"] == "LayoutApplied")
    assert cond["reason"] == "WaitingForIdle" and "7g.141gb@0:8" in cond["message"]
