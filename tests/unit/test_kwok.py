"""KWOK in the dev cluster, without running it: the stages, the Nodes it manages, its command line,
its credentials, and that it is built and started only when asked for (docs/kwok.md)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

from gpupack.cli import main
from gpupack.devcluster import components, kwok
from gpupack.devcluster.binaries import NAMES, Binaries, ensure_binaries, optional_names
from gpupack.devcluster.controlplane import ControlPlane, ControlPlaneConfig
from gpupack.devcluster.errors import BuildFailed
from sharing.api.keys import DURATION_ANNOTATION

PORTS = {"apiserver": 6443, "etcd": 2379, "etcd-peer": 2380, "scheduler": 10259, "kwok": 10247}
BUILD_SH = Path(__file__).resolve().parents[2] / "tools" / "k8s" / "build.sh"
STAGE_NAMES = {"gpupack-node-initialize", "gpupack-node-heartbeat", "gpupack-pod-ready",
               "gpupack-pod-complete", "gpupack-pod-delete"}


def _by_name() -> dict[str, dict[str, Any]]:
    return {s["metadata"]["name"]: s for s in kwok.stages()}


def _keys(stage: dict[str, Any]) -> list[str]:
    return [e["jq"]["key"] for e in stage["spec"]["selector"]["matchExpressions"]]


# ------------------------------------------------------------------ stages

def test_the_stages_shipped() -> None:
    stages = _by_name()
    assert set(stages) == STAGE_NAMES
    kinds = {name: s["spec"]["resourceRef"]["kind"] for name, s in stages.items()}
    assert kinds == {n: ("Node" if "node" in n else "Pod") for n in STAGE_NAMES}
    assert all(s["spec"]["resourceRef"]["apiGroup"] == "v1" for s in stages.values())


def test_the_completion_stage_reads_the_duration_annotation_of_any_pod() -> None:
    stage = _by_name()["gpupack-pod-complete"]
    key = f'.metadata.annotations["{DURATION_ANNOTATION}"]'
    assert any(k.startswith(key) for k in _keys(stage))
    assert key in stage["spec"]["delay"]["durationFrom"]["jq"]["expression"]
    # Unlike kwok's stock stage, the owner does not matter (that one wants Job pods).
    assert not any("ownerReferences" in k for k in _keys(stage))
    assert "phase: Succeeded" in stage["spec"]["next"]["statusTemplate"]


def test_pods_start_at_once_and_keep_the_schedulers_condition() -> None:
    stage = _by_name()["gpupack-pod-ready"]
    assert "delay" not in stage["spec"]
    template = stage["spec"]["next"]["statusTemplate"]
    assert "phase: Running" in template and "startTime:" in template
    # PodScheduled's time is when the pod was bound: left as the scheduler wrote it.
    assert "PodScheduled" not in template


def test_nodes_heartbeat_about_as_often_as_a_kubelet_reports_status() -> None:
    delay = _by_name()["gpupack-node-heartbeat"]["spec"]["delay"]
    assert 240_000 <= delay["durationMilliseconds"] < delay["jitterDurationMilliseconds"] <= 360_000


def test_deleted_pods_are_removed() -> None:
    stage = _by_name()["gpupack-pod-delete"]
    assert stage["spec"]["next"] == {"delete": True}
    assert _keys(stage) == [".metadata.deletionTimestamp", ".metadata.finalizers"]


def _write(directory: Path, *docs: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "stages.yaml").write_text(yaml.safe_dump_all(docs), encoding="utf-8")
    return directory


def _stage(name: str, kind: str = "Stage", api: str = kwok.STAGE_API_VERSION) -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "metadata": {"name": name}, "spec": {}}


@pytest.mark.parametrize("docs, message", [
    pytest.param([_stage("a"), _stage("a")], "two named 'a'", id="duplicate"),
    pytest.param([_stage("a", kind="ConfigMap", api="v1")], "is not a", id="not-a-stage"),
    pytest.param([_stage("a", api="kwok.x-k8s.io/v1beta9")], "is not a", id="other-version"),
    pytest.param([_stage("")], "without a name", id="no-name"),
    pytest.param([], "no Stage documents", id="empty"),
])
def test_bad_stage_files_are_refused(docs: list[dict[str, Any]], message: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=message):
        kwok.stages(_write(tmp_path / "stages", *docs))


def test_the_config_file_holds_every_stage(tmp_path: Path) -> None:
    path = kwok.write_config(tmp_path / "sub" / "kwok.yaml")
    assert list(yaml.safe_load_all(path.read_text(encoding="utf-8"))) == kwok.stages()


# ------------------------------------------------------------------ nodes

def test_a_node_kwok_manages() -> None:
    node = kwok.node_manifest("gpu-7", cpu=64, memory="512Gi", pods=250,
                              extended={"nvidia.com/gpu": 8, "gpupack.io/mps-share": "800"},
                              labels={"gpupack.io/model": "H100", "kubernetes.io/arch": "arm64"})
    meta, status = node["metadata"], node["status"]
    assert meta["name"] == "gpu-7"
    assert meta["annotations"] == {kwok.MANAGED_ANNOTATION: kwok.MANAGED_VALUE}
    assert meta["labels"][kwok.MANAGED_ANNOTATION] == kwok.MANAGED_VALUE
    assert meta["labels"]["kubernetes.io/hostname"] == "gpu-7"
    assert meta["labels"]["gpupack.io/model"] == "H100"
    assert meta["labels"]["kubernetes.io/arch"] == "arm64"  # labels passed in win
    expected = {"cpu": "64", "memory": "512Gi", "pods": "250", "nvidia.com/gpu": "8", "gpupack.io/mps-share": "800"}
    assert status["capacity"] == status["allocatable"] == expected
    assert status["capacity"] is not status["allocatable"]
    json.dumps(node)  # a plain payload the API takes as it is


def test_a_node_with_an_address() -> None:
    node = kwok.node_manifest("gpu-7", address=kwok.node_address(0))
    assert node["status"]["addresses"] == [{"type": "InternalIP", "address": "10.64.0.1"},
                                           {"type": "Hostname", "address": "gpu-7"}]
    assert "addresses" not in kwok.node_manifest("gpu-7")["status"]


@pytest.mark.parametrize("number, expected", [(0, "10.64.0.1"), (255, "10.64.1.0"), (1_048_573, "10.79.255.254")])
def test_node_addresses(number: int, expected: str) -> None:
    assert kwok.node_address(number) == expected


@pytest.mark.parametrize("number", [-1, 1_048_574])
def test_node_addresses_outside_the_range_are_refused(number: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        kwok.node_address(number)


@pytest.mark.parametrize("name, kwargs, message", [
    pytest.param("n", {"address": "10.64.0.300"}, "does not appear to be an IPv4 or IPv6 address", id="bad-address"),
    pytest.param("n", {"extended": {"cpu": 4}}, "cpu as their own", id="cpu-in-extended"),
    pytest.param("n", {"extended": {"pods": 4, "memory": "1Gi"}}, "memory, pods", id="two-in-extended"),
    pytest.param("n", {"pods": 0}, "at least one pod", id="no-pods"),
    pytest.param("", {}, "not a Node name", id="empty-name"),
    pytest.param("Node-1", {}, "not a Node name", id="upper-case"),
])
def test_bad_nodes_are_refused(name: str, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        kwok.node_manifest(name, **kwargs)


@pytest.mark.parametrize("count, prefix, start, expected", [
    pytest.param(3, "kwok-node-", 0, ["kwok-node-0000", "kwok-node-0001", "kwok-node-0002"], id="three"),
    pytest.param(2, "g-", 9998, ["g-9998", "g-9999"], id="up-to-four-digits"),
    pytest.param(2, "g-", 9999, ["g-09999", "g-10000"], id="five-digits-sort-in-order"),
    pytest.param(0, "g-", 0, [], id="none"),
])
def test_node_names(count: int, prefix: str, start: int, expected: list[str]) -> None:
    assert kwok.node_names(count, prefix, start) == expected


def test_a_negative_count_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        kwok.node_names(-1)


@pytest.mark.parametrize("status, expected", [
    pytest.param({"conditions": [{"type": "Ready", "status": "True"}]}, True, id="ready"),
    pytest.param({"conditions": [{"type": "Ready", "status": "False"}]}, False, id="not-ready"),
    pytest.param({"conditions": [{"type": "MemoryPressure", "status": "True"}]}, False, id="other-condition"),
    pytest.param({}, False, id="no-conditions"),
    pytest.param(None, False, id="no-status"),
])
def test_ready(status: dict[str, Any] | None, expected: bool) -> None:
    assert kwok.ready({"metadata": {"name": "n"}, "status": status}) is expected


# ------------------------------------------------------------------ command line and credentials

def test_command_line(tmp_path: Path) -> None:
    argv = components.kwok_argv(Binaries(tmp_path), tmp_path, PORTS)
    flags = dict(a.removeprefix("--").split("=", 1) for a in argv[1:])
    assert argv[0] == str(tmp_path / "kwok")
    assert flags["kubeconfig"] == str(tmp_path / "kwok.kubeconfig")
    assert flags["config"] == str(components.kwok_config_path(tmp_path))
    assert flags["manage-all-nodes"] == "false"
    assert flags["manage-nodes-with-annotation-selector"] == "kwok.x-k8s.io/node=fake"
    assert int(flags["node-lease-duration-seconds"]) == kwok.NODE_LEASE_SECONDS == 40
    assert flags["server-address"] == "127.0.0.1:10247"
    assert flags["v"] == "WARN"  # not a line per Lease renewal
    assert components.kwok_url(PORTS) == "http://127.0.0.1:10247"
    # Not the user's ~/.kwok: its kwok.yaml would be loaded on top of ours.
    assert components.kwok_env(tmp_path) == {"KWOK_WORKDIR": str(tmp_path / "kwok")}


def test_its_rights_go_to_its_own_user() -> None:
    role, binding = sorted(kwok.rbac(), key=lambda o: str(o["kind"]))
    assert (role["kind"], binding["kind"]) == ("ClusterRole", "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": kwok.USER}]
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    for needed in [("", "nodes", "watch"), ("", "nodes/status", "patch"), ("", "pods/status", "patch"),
                   ("", "pods", "delete"), ("coordination.k8s.io", "leases", "create"),
                   ("coordination.k8s.io", "leases", "update")]:
        assert needed in granted
    # Nothing it does not need: no writes to Node or pod objects themselves, no Secrets.
    assert not {v for g, r, v in granted if r in ("nodes", "pods")} - {"get", "list", "watch", "delete"}
    assert ("", "nodes", "delete") not in granted
    assert not any(r == "secrets" for _, r, _ in granted)


def test_its_own_client_certificate(tmp_path: Path) -> None:
    plane = ControlPlane(Binaries(tmp_path), ControlPlaneConfig(workdir=tmp_path / "cp", kwok=True))
    plane._pick_ports()
    plane._write_pki()
    config = yaml.safe_load((plane.workdir / "kwok.kubeconfig").read_text(encoding="utf-8"))
    (user,) = config["users"]
    cert = x509.load_pem_x509_certificate(base64.b64decode(user["user"]["client-certificate-data"]))
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == kwok.USER
    assert not cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)  # not system:masters
    assert "kwok" in plane.ports


def test_off_by_default(tmp_path: Path) -> None:
    assert ControlPlaneConfig().kwok is False
    plane = ControlPlane(Binaries(tmp_path), ControlPlaneConfig(workdir=tmp_path / "cp"))
    plane._pick_ports()
    plane._write_pki()
    assert "kwok" not in plane.ports
    assert not (plane.workdir / "kwok.kubeconfig").exists()
    with pytest.raises(RuntimeError, match="not part of this control plane"):
        plane.start_component("kwok")


# ------------------------------------------------------------------ built only when asked for

def test_optional_names() -> None:
    assert optional_names() == ()
    assert optional_names(kwok=True) == ("kwok",)
    assert optional_names(controller_manager=True, kwok=True) == ("kube-controller-manager", "kwok")


def test_a_missing_kwok_is_needed_only_when_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in NAMES:
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("GPUPACK_K8S_BIN_DIR", str(bin_dir))
    assert ensure_binaries(build=False).bin_dir == bin_dir
    with pytest.raises(BuildFailed, match="lacks kwok"):
        ensure_binaries(kwok=True)
    monkeypatch.delenv("GPUPACK_K8S_BIN_DIR")
    # A control plane asked to run it fails before starting anything, naming the build.
    plane = ControlPlane(Binaries(bin_dir), ControlPlaneConfig(kwok=True))
    with pytest.raises(BuildFailed, match="tools/k8s/build.sh kwok"):
        plane.start()
    assert not plane.processes and not plane.workdir.exists()


def test_up_help_describes_the_kwok_flag(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit):
        main(["dev", "cluster", "up", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--kwok also run kwok" in out and "implies --controller-manager" in out
    assert DURATION_ANNOTATION in out


@pytest.mark.parametrize("reported, cached", [
    pytest.param("kwok version v0.8.0 go1.26.8 (linux/amd64)", True, id="pinned-version"),
    pytest.param("kwok version v0.7.0 go1.26.8 (linux/amd64)", False, id="older-version"),
    pytest.param("kwok version v0.8.01 go1.26.8 (linux/amd64)", False, id="a-longer-version"),
])
def test_build_sh_counts_a_kwok_of_another_version_as_missing(
    reported: str, cached: bool, tmp_path: Path
) -> None:
    """tools/k8s/build.sh keys the cache by the kube and etcd versions only; kwok by what it reports."""
    pinned = subprocess.run(["awk", '$1 == "require" && $2 == "sigs.k8s.io/kwok" {print $3}',
                             str(kwok.KWOK_DIR / "go.mod")], capture_output=True, text=True, check=True)
    assert pinned.stdout.strip() == "v0.8.0"  # the version the cases above are written for
    no_go = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "go").exists())
    env = {"HOME": str(tmp_path), "PATH": no_go, "GPUPACK_CACHE_DIR": str(tmp_path / "cache")}
    where = subprocess.run(["bash", str(BUILD_SH), "--print-bin-dir"], env=env, capture_output=True, text=True,
                           check=True)
    bin_dir = Path(where.stdout.strip())
    bin_dir.mkdir(parents=True)
    (bin_dir / "kwok").write_text(f"#!/bin/sh\necho '{reported}'\n")
    (bin_dir / "kwok").chmod(0o755)
    # No Go on this PATH: a kwok counted as missing ends in build.sh's "no toolchain" exit (3).
    run = subprocess.run(["bash", str(BUILD_SH), "kwok"], env=env, capture_output=True, text=True)
    assert run.returncode == (0 if cached else 3), run.stderr
    assert (run.stdout.strip() == str(bin_dir)) is cached
