"""The kubelet PodResources client, against a real gRPC server on a unix socket.

The server is the generated ``PodResourcesListerServicer`` (what the kubelet implements),
so the client's stub, the wire format and the conversion to ``PodDevices`` are all real;
only what the server answers is scripted.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest

from node.kubeletapi import podresources_v1_pb2 as pb
from node.kubeletapi import podresources_v1_pb2_grpc as pb_grpc
from node.podresources import PodDevices, PodResourcesError, device_owners, list_pod_devices, pod_devices

Pods = list[tuple[str, str, list[tuple[str, list[str]]]]]
"""(name, namespace, [(resource, device ids)]) per pod, one container each."""


def _response(pods: Pods) -> pb.ListPodResourcesResponse:
    response = pb.ListPodResourcesResponse()
    for name, namespace, devices in pods:
        pod = response.pod_resources.add(name=name, namespace=namespace)
        # Fields the client ignores, filled so that it must skip them: exclusive CPUs, memory, NUMA.
        container = pod.containers.add(name="main", cpu_ids=[4, 5])
        container.memory.add(memory_type="memory", size=1 << 30)
        for resource, ids in devices:
            group = container.devices.add(resource_name=resource, device_ids=ids)
            group.topology.nodes.add(ID=0)
    return response


SAMPLE = _response([
    ("train", "ml", [("nvidia.com/mig-3g.71gb", ["MIG-aaa"])]),
    ("notebook", "ds", [("nvidia.com/gpu.shared", ["GPU-bbb::0", "GPU-bbb::3"]), ("example.com/nic", ["eth9"])]),
    ("web", "default", []),
])


class Kubelet(pb_grpc.PodResourcesListerServicer):
    """Answers ``List`` with ``answer(request, context)``."""

    def __init__(self, answer: Callable[[pb.ListPodResourcesRequest, Any], pb.ListPodResourcesResponse]) -> None:
        self.answer = answer
        self.calls = 0

    def List(self, request: pb.ListPodResourcesRequest, context: Any) -> pb.ListPodResourcesResponse:
        self.calls += 1
        return self.answer(request, context)


def _serve(path: Path, handler: Any) -> Any:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    if isinstance(handler, pb_grpc.PodResourcesListerServicer):
        pb_grpc.add_PodResourcesListerServicer_to_server(handler, server)
    else:
        server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix://{path}")
    server.start()
    return server


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:  # short path: unix socket names are limited to ~100 bytes
        yield Path(tmp)


def test_pod_devices_keeps_each_device_group_and_skips_pods_without_devices() -> None:
    pods = pod_devices(SAMPLE)
    assert pods == [
        PodDevices("ml", "train", "nvidia.com/mig-3g.71gb", ("MIG-aaa",)),
        PodDevices("ds", "notebook", "nvidia.com/gpu.shared", ("GPU-bbb::0", "GPU-bbb::3")),
        PodDevices("ds", "notebook", "example.com/nic", ("eth9",)),
    ]
    assert device_owners(pods) == {"MIG-aaa": ["ml/train"], "GPU-bbb": ["ds/notebook"]}


def test_list_over_grpc(socket_dir: Path) -> None:
    kubelet = Kubelet(lambda request, _context: SAMPLE)
    server = _serve(socket_dir / "kubelet.sock", kubelet)
    try:
        pods = list_pod_devices(socket_dir / "kubelet.sock", timeout_s=5)
    finally:
        server.stop(grace=None)
    assert kubelet.calls == 1
    assert {p.key for p in pods} == {"ml/train", "ds/notebook"}
    assert device_owners(pods) == {"MIG-aaa": ["ml/train"], "GPU-bbb": ["ds/notebook"]}


def _raw(answer: bytes) -> Any:
    """A handler that answers ``List`` with raw bytes, bypassing the generated serializer."""
    return grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
        "List": grpc.unary_unary_rpc_method_handler(lambda _request, _context: answer)})


@pytest.mark.parametrize("garbage", [b"\x0a\xff", b"\x0a\x05ab", b"\x0f"], ids=["bad-varint", "truncated", "wire-7"])
def test_malformed_answers_are_errors_not_crashes(socket_dir: Path, garbage: bytes) -> None:
    server = _serve(socket_dir / "kubelet.sock", _raw(garbage))
    try:
        with pytest.raises(PodResourcesError, match=r"(?s)PodResources List failed.*deserializing"):
            list_pod_devices(socket_dir / "kubelet.sock", timeout_s=5)
    finally:
        server.stop(grace=None)


def _slow(_request: pb.ListPodResourcesRequest, _context: Any) -> pb.ListPodResourcesResponse:
    time.sleep(2)
    return SAMPLE


def _refuse(_request: pb.ListPodResourcesRequest, context: Any) -> pb.ListPodResourcesResponse:
    context.abort(grpc.StatusCode.PERMISSION_DENIED, "pod-resources: not allowed")
    raise AssertionError("abort returns only by raising")


@pytest.mark.parametrize("answer, timeout_s, match", [
    (_slow, 0.2, "DEADLINE_EXCEEDED"),
    (_refuse, 5.0, "PERMISSION_DENIED"),
], ids=["timeout", "kubelet-refuses"])
def test_a_failing_call_is_an_error_within_the_timeout(socket_dir: Path, answer: Any, timeout_s: float,
                                                       match: str) -> None:
    server = _serve(socket_dir / "kubelet.sock", Kubelet(answer))
    try:
        start = time.monotonic()
        with pytest.raises(PodResourcesError, match=match):
            list_pod_devices(socket_dir / "kubelet.sock", timeout_s=timeout_s)
        assert time.monotonic() - start < timeout_s + 1.5
    finally:
        server.stop(grace=None)


def test_missing_socket_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PodResourcesError, match="no kubelet PodResources socket"):
        list_pod_devices(tmp_path / "nope.sock")


def test_a_stale_socket_nobody_listens_on_is_an_error(socket_dir: Path) -> None:
    server = _serve(socket_dir / "kubelet.sock", Kubelet(lambda request, _context: SAMPLE))
    server.stop(grace=None)  # the kubelet went away; its socket file may stay behind
    (socket_dir / "kubelet.sock").touch()
    with pytest.raises(PodResourcesError, match="UNAVAILABLE"):
        list_pod_devices(socket_dir / "kubelet.sock", timeout_s=2)


def test_agent_on_a_real_node_pins_what_the_kubelet_says_a_pod_holds(socket_dir: Path) -> None:
    """A GPU node (not simulated): PodResources names the pod on the 7g instance; it is not reshaped."""
    from mig.catalog import get_model
    from node.agent import Agent
    from node.nvml.simulated import SimulatedNvml
    from node.base.settings import AgentSettings
    from tests.unit.test_reconciler_agent import Clock, FakeKube

    h200 = get_model("H200")
    sim = SimulatedNvml(h200, 1, seed="n1")
    seven = h200.profile("7g.141gb")
    mig_uuid = sim.create_gpu_instance(0, seven.profile_id, seven.placements[0]).uuid

    class HardwareNvml:  # the same GPUs, but not the simulation class: the agent treats it as real NVML
        kind = "nvml"

        def __getattr__(self, name: str) -> Any:
            return getattr(sim, name)

    path = socket_dir / "k.sock"
    answer = _response([("train", "ml", [("nvidia.com/mig-7g.141gb", [mig_uuid])])])
    kubelet = Kubelet(lambda _request, _context: answer)
    server = _serve(path, kubelet)
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
    assert kubelet.calls >= 1
    assert [i.profile for i in sim.gpu_instances(0)] == ["7g.141gb"]
    assert kube.gpunode is not None
    gpu0 = kube.gpunode["status"]["gpus"][0]["instances"][0]
    assert gpu0["pods"] == ["ml/train"] and gpu0["inUse"] is True
    cond = next(c for c in kube.gpunode["status"]["conditions"] if c["type"] == "LayoutApplied")
    assert cond["reason"] == "WaitingForIdle" and "7g.141gb@0:8" in cond["message"]
