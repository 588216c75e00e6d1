"""The dev control plane stops and restarts one component, as the fault benchmark does (benchmarks/faults.py)."""

from __future__ import annotations

import pytest
from kubernetes import client
from urllib3.exceptions import HTTPError

from gpupack.devcluster.controlplane import ControlPlane


@pytest.fixture(scope="module")
def plane(private_control_plane: ControlPlane) -> ControlPlane:
    return private_control_plane


def test_etcd_and_the_api_server_come_back_with_the_data(plane: ControlPlane) -> None:
    with plane.admin_client() as admin:
        core = client.CoreV1Api(admin)
        core.create_namespaced_config_map("default", client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="kept"), data={"k": "v"}))
        plane.stop_component("etcd")
        with pytest.raises((client.ApiException, HTTPError)):  # held, then timed out by the client
            core.read_namespaced_config_map("kept", "default", _request_timeout=3)
        plane.start_component("etcd")
        assert core.read_namespaced_config_map("kept", "default").data == {"k": "v"}
        plane.stop_component("kube-apiserver")
        with pytest.raises(HTTPError):  # nothing listens
            core.read_namespaced_config_map("kept", "default", _request_timeout=3)
        plane.start_component("kube-apiserver")
        assert core.read_namespaced_config_map("kept", "default").data == {"k": "v"}
    with pytest.raises(RuntimeError, match="already running"):
        plane.start_component("etcd")
    with pytest.raises(ValueError, match="unknown component"):
        plane.start_component("kubelet")
