"""The committed kubelet gRPC stubs (node/kubeletapi): messages round-trip, each service works
over a unix socket, pyproject's version floors match what the generated code checks at import,
and the generator's gogoproto stripping (unused by the pinned protos) does what it says.
tests/integration/test_kubelet_stubs.py checks that regenerating them changes nothing."""

from __future__ import annotations

import functools
import importlib.util
import re
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest

from node.kubeletapi import dra_v1_pb2 as dra
from node.kubeletapi import dra_v1_pb2_grpc as dra_grpc
from node.kubeletapi import pluginregistration_v1_pb2 as reg
from node.kubeletapi import pluginregistration_v1_pb2_grpc as reg_grpc
from node.kubeletapi import podresources_v1_pb2 as podres

ROOT = Path(__file__).resolve().parents[2]
STUBS = ROOT / "node" / "kubeletapi"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


@functools.cache
def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kubelet_proto_generate", ROOT / "tools" / "proto" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_node_prepare_resources_round_trips() -> None:
    request = dra.NodePrepareResourcesRequest(claims=[dra.Claim(namespace="ml", uid="u-1", name="train-gpu")])
    decoded = dra.NodePrepareResourcesRequest.FromString(request.SerializeToString())
    assert decoded == request and decoded.claims[0].uid == "u-1"

    response = dra.NodePrepareResourcesResponse()
    prepared = response.claims["u-1"]
    prepared.devices.add(request_names=["gpu"], pool_name="n1", device_name="gpu-0-mig-3g-4",
                         cdi_device_ids=["gpu.gpupack.io/gpu=gpu-0-mig-3g-4"], share_id="s1")
    response.claims["u-2"].error = "no such device"
    decoded_response = dra.NodePrepareResourcesResponse.FromString(response.SerializeToString())
    assert decoded_response == response
    assert decoded_response.claims["u-1"].devices[0].HasField("share_id")  # proto3 optional
    assert decoded_response.claims["u-2"].error == "no such device" and not decoded_response.claims["u-2"].devices


def test_plugin_registration_messages_round_trip() -> None:
    info = reg.PluginInfo(type="DRAPlugin", name="gpu.gpupack.io", endpoint="/var/lib/kubelet/plugins/gpu.gpupack.io/dra.sock",
                          supported_versions=["v1.DRAPlugin"])
    assert reg.PluginInfo.FromString(info.SerializeToString()) == info
    status = reg.RegistrationStatus(plugin_registered=False, error="version not supported")
    assert reg.RegistrationStatus.FromString(status.SerializeToString()) == status


def test_list_pod_resources_response_round_trips() -> None:
    response = podres.ListPodResourcesResponse()
    pod = response.pod_resources.add(name="train", namespace="ml")
    container = pod.containers.add(name="main", cpu_ids=[2, 3])
    container.devices.add(resource_name="nvidia.com/mig-3g.71gb", device_ids=["MIG-aaa"])
    claim = container.dynamic_resources.add(claim_name="gpu", claim_namespace="ml")
    claim.claim_resources.add(driver_name="gpu.gpupack.io", pool_name="n1", device_name="gpu-0",
                              cdi_devices=[podres.CDIDevice(name="gpu.gpupack.io/gpu=gpu-0")])
    data = response.SerializeToString()
    assert podres.ListPodResourcesResponse.FromString(data) == response
    # Field numbers are the kubelet's: pod_resources = 1, then name = 1 inside it.
    assert data.startswith(b"\x0a") and b"\x0a\x05train" in data


class _Plugin(dra_grpc.DRAPluginServicer, reg_grpc.RegistrationServicer):
    def NodePrepareResources(self, request: dra.NodePrepareResourcesRequest,
                             context: Any) -> dra.NodePrepareResourcesResponse:
        response = dra.NodePrepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].devices.add(pool_name="n1", device_name=f"dev-{claim.name}")
        return response

    def GetInfo(self, request: reg.InfoRequest, context: Any) -> reg.PluginInfo:
        return reg.PluginInfo(type="DRAPlugin", name="gpu.gpupack.io", supported_versions=["v1.DRAPlugin"])


@pytest.fixture
def plugin_socket() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:  # short path: unix socket names are limited to ~100 bytes
        path = Path(tmp) / "plugin.sock"
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        plugin = _Plugin()
        dra_grpc.add_DRAPluginServicer_to_server(plugin, server)
        reg_grpc.add_RegistrationServicer_to_server(plugin, server)
        server.add_insecure_port(f"unix://{path}")
        server.start()
        try:
            yield path
        finally:
            server.stop(grace=None)


def test_the_services_work_over_a_unix_socket(plugin_socket: Path) -> None:
    with grpc.insecure_channel(f"unix://{plugin_socket}") as channel:
        info = reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=5)
        prepared = dra_grpc.DRAPluginStub(channel).NodePrepareResources(
            dra.NodePrepareResourcesRequest(claims=[dra.Claim(namespace="ml", uid="u-1", name="a")]), timeout=5)
        with pytest.raises(grpc.RpcError) as unimplemented:
            dra_grpc.DRAPluginStub(channel).NodeUnprepareResources(dra.NodeUnprepareResourcesRequest(), timeout=5)
    assert info.name == "gpu.gpupack.io"
    assert prepared.claims["u-1"].devices[0].device_name == "dev-a"
    assert unimplemented.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_service_names_are_the_kubelets() -> None:
    assert dra.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    assert reg.DESCRIPTOR.services_by_name["Registration"].full_name == "pluginregistration.Registration"
    assert podres.DESCRIPTOR.services_by_name["PodResourcesLister"].full_name == "v1.PodResourcesLister"


def _floor(requirement_name: str) -> str:
    for requirement in PYPROJECT["project"]["dependencies"]:
        match = re.fullmatch(rf"{requirement_name}\s*>=\s*([0-9.]+)(,\s*<.*)?", requirement)
        if match:
            return match.group(1)
    raise AssertionError(f"no {requirement_name}>=... in pyproject.toml's dependencies")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def test_pyproject_floors_cover_what_the_generated_code_checks_at_import() -> None:
    """The *_pb2 modules refuse an older protobuf, the *_pb2_grpc modules an older grpcio."""
    for pb2 in sorted(STUBS.glob("*_pb2.py")):
        gencode = re.search(r"^# Protobuf Python Version: ([0-9.]+)$", pb2.read_text(), re.MULTILINE)
        assert gencode, pb2
        assert _version(_floor("protobuf")) >= _version(gencode.group(1)), pb2
    for grpc_py in sorted(STUBS.glob("*_pb2_grpc.py")):
        generated = re.search(r"^GRPC_GENERATED_VERSION = '([0-9.]+)'$", grpc_py.read_text(), re.MULTILINE)
        assert generated, grpc_py
        assert _version(_floor("grpcio")) >= _version(generated.group(1)), grpc_py


def test_the_test_extra_pins_the_generators_grpcio_tools() -> None:
    pinned = _generator().GRPCIO_TOOLS_VERSION
    assert f"grpcio-tools=={pinned}" in PYPROJECT["project"]["optional-dependencies"]["test"]
    for path in STUBS.iterdir():
        if path.suffix in (".py", ".pyi"):
            assert path.read_text().startswith("# Generated by tools/proto/generate.py. DO NOT EDIT."), path


GOGO = '''syntax = "proto3";
package v1beta1;
import "github.com/gogo/protobuf/gogoproto/gogo.proto";
option (gogoproto.goproto_stringer_all) = false;
option (gogoproto.stringer_all) =  true;
option go_package = "k8s.io/kubelet/pkg/apis/example";

message Claim {
    string uid = 1 [(gogoproto.customname) = "UID"];
    repeated Device devices = 2 [(gogoproto.nullable) = false, deprecated = true];
    string name = 3 [deprecated = true];
}
'''


def test_strip_gogoproto_removes_exactly_its_imports_and_options() -> None:
    stripped, removed = _generator().strip_gogoproto(GOGO)
    assert removed == 5
    assert stripped == '''syntax = "proto3";
package v1beta1;
option go_package = "k8s.io/kubelet/pkg/apis/example";

message Claim {
    string uid = 1;
    repeated Device devices = 2 [deprecated = true];
    string name = 3 [deprecated = true];
}
'''
    assert _generator().strip_gogoproto(stripped) == (stripped, 0)
