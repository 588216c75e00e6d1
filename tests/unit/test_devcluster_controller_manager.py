"""The dev cluster's optional kube-controller-manager: its command line, credentials and binary.

Its ServiceAccount signing key must be the API server's, its controllers the
ones asked for, and node-lifecycle must never run (the dev cluster's Nodes have
no kubelet: it would taint them NotReady and evict their pods).
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

from gpupack.devcluster import components
from gpupack.devcluster.binaries import NAMES, Binaries, ensure_binaries
from gpupack.devcluster.controlplane import CONTROLLER_MANAGER_USER, ControlPlane, ControlPlaneConfig
from gpupack.devcluster.errors import BuildFailed

PORTS = {"apiserver": 6443, "etcd": 2379, "etcd-peer": 2380, "scheduler": 10259, "controller-manager": 10257}


def _flags(argv: list[str]) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in argv[1:])


def test_command_line(tmp_path: Path) -> None:
    argv = components.controller_manager_argv(Binaries(tmp_path), tmp_path, PORTS)
    flags = _flags(argv)
    apiserver = _flags(components.apiserver_argv(Binaries(tmp_path), tmp_path, PORTS))
    assert argv[0] == str(tmp_path / "kube-controller-manager")
    assert flags["kubeconfig"] == str(tmp_path / "controller-manager.kubeconfig")
    assert flags["use-service-account-credentials"] == "true"
    # Tokens it signs are checked by the API server: the same key pair.
    assert flags["service-account-private-key-file"] == apiserver["service-account-signing-key-file"]
    assert apiserver["service-account-key-file"] == str(tmp_path / "pki" / "sa.pub")
    assert flags["root-ca-file"] == apiserver["client-ca-file"] == str(tmp_path / "pki" / "ca.crt")
    assert flags["leader-elect"] == "false"
    assert flags["bind-address"] == components.HOST and flags["secure-port"] == "10257"
    assert flags["controllers"].split(",") == list(components.DEFAULT_CONTROLLERS)
    assert components.controller_manager_url(PORTS) == "https://127.0.0.1:10257"


def test_default_controllers_leave_out_node_lifecycle() -> None:
    assert "replicaset-controller" in components.DEFAULT_CONTROLLERS
    assert "disruption-controller" in components.DEFAULT_CONTROLLERS
    assert not set(components.NODE_LIFECYCLE) & set(components.DEFAULT_CONTROLLERS)
    assert "*" not in components.DEFAULT_CONTROLLERS


def test_the_controllers_given_are_the_ones_run(tmp_path: Path) -> None:
    argv = components.controller_manager_argv(Binaries(tmp_path), tmp_path, PORTS, ("replicaset", "disruption"))
    assert "--controllers=replicaset,disruption" in argv


@pytest.mark.parametrize("controllers", [
    pytest.param(("node-lifecycle-controller",), id="node-lifecycle"),
    pytest.param(("replicaset", "nodelifecycle"), id="old-alias"),
    pytest.param(("*",), id="star-runs-it"),
    pytest.param(("*", "-replicaset-controller"), id="star-without-negating-it"),
    pytest.param((), id="empty"),
])
def test_controller_lists_refused(controllers: tuple[str, ...], tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        components.controller_manager_argv(Binaries(tmp_path), tmp_path, PORTS, controllers)
    with pytest.raises(ValueError):
        ControlPlaneConfig(controller_manager=True, controllers=controllers)


@pytest.mark.parametrize("controllers", [
    pytest.param(("*", "-node-lifecycle-controller"), id="star-negated-new-name"),
    pytest.param(("*", "-nodelifecycle"), id="star-negated-old-alias"),
    pytest.param(("replicaset",), id="one"),
])
def test_controller_lists_accepted(controllers: tuple[str, ...]) -> None:
    components.check_controllers(controllers)
    assert ControlPlaneConfig(controller_manager=True, controllers=controllers).controllers == controllers


def test_off_by_default_and_no_port_or_credentials_without_it(tmp_path: Path) -> None:
    assert ControlPlaneConfig().controller_manager is False
    plane = ControlPlane(Binaries(tmp_path), ControlPlaneConfig(workdir=tmp_path / "cp"))
    plane._pick_ports()
    plane._write_pki()
    assert "controller-manager" not in plane.ports
    assert not (plane.workdir / "controller-manager.kubeconfig").exists()
    with pytest.raises(RuntimeError, match="not part of this control plane"):
        plane.start_component("kube-controller-manager")


def test_its_own_client_certificate(tmp_path: Path) -> None:
    plane = ControlPlane(Binaries(tmp_path), ControlPlaneConfig(workdir=tmp_path / "cp", controller_manager=True))
    plane._pick_ports()
    plane._write_pki()
    config = yaml.safe_load((plane.workdir / "controller-manager.kubeconfig").read_text(encoding="utf-8"))
    (user,) = config["users"]
    assert user["name"] == CONTROLLER_MANAGER_USER == "system:kube-controller-manager"
    cert = x509.load_pem_x509_certificate(base64.b64decode(user["user"]["client-certificate-data"]))
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == CONTROLLER_MANAGER_USER
    assert not cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)  # not system:masters
    assert config["clusters"][0]["cluster"]["server"] == plane.server
    assert "controller-manager" in plane.ports


def _three_binaries(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        (directory / name).write_text("#!/bin/sh\n")
        (directory / name).chmod(0o755)
    return directory


def test_the_three_do_without_the_controller_manager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPACK_K8S_BIN_DIR", str(_three_binaries(tmp_path / "bin")))
    binaries = ensure_binaries(build=False)
    assert binaries.missing() == []
    assert binaries.missing(("kube-controller-manager",)) == ["kube-controller-manager"]


def test_asking_for_a_missing_controller_manager_names_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = _three_binaries(tmp_path / "bin")
    monkeypatch.setenv("GPUPACK_K8S_BIN_DIR", str(bin_dir))
    with pytest.raises(BuildFailed, match="lacks kube-controller-manager"):
        ensure_binaries(controller_manager=True)
    monkeypatch.delenv("GPUPACK_K8S_BIN_DIR")
    with pytest.raises(BuildFailed) as info:
        Binaries(bin_dir).require("kube-controller-manager")
    assert "tools/k8s/build.sh kube-controller-manager" in str(info.value)
    # A control plane asked to run it fails before starting anything, and cleans up.
    plane = ControlPlane(Binaries(bin_dir), ControlPlaneConfig(controller_manager=True))
    with pytest.raises(BuildFailed, match="kube-controller-manager is not built"):
        plane.start()
    assert not plane.processes and not plane.workdir.exists()


def test_require_finds_a_built_binary(tmp_path: Path) -> None:
    binary = tmp_path / "kube-controller-manager"
    binary.write_text("#!/bin/sh\n")
    os.chmod(binary, 0o755)
    assert Binaries(tmp_path).require("kube-controller-manager") == binary == Binaries(tmp_path).kube_controller_manager
