"""Start-up, teardown and faults of the local control plane: clear errors, no hangs, no strays."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupack.devcluster.binaries import ensure_binaries
from gpupack.devcluster.controlplane import ControlPlane, ControlPlaneConfig
from gpupack.devcluster.errors import BuildFailed, PortInUse, StartFailed, ToolchainMissing
from gpupack.devcluster.process import wait_until
from gpupack.devcluster.state import Component, alive

REPO = Path(__file__).resolve().parents[2]


def _gone(pids: list[int], timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(_running(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


@pytest.fixture
def listening_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_port_in_use_names_port_and_fix(control_plane: ControlPlane, listening_port: int) -> None:
    plane = ControlPlane(control_plane.binaries, ControlPlaneConfig(apiserver_port=listening_port))
    with pytest.raises(PortInUse) as info:
        plane.start()
    message = str(info.value)
    assert f"127.0.0.1:{listening_port}" in message and "kube-apiserver" in message
    assert "fix:" in message
    assert not plane.processes and not plane.workdir.exists()


def test_a_picked_port_taken_before_binding_is_picked_afresh(
    control_plane: ControlPlane, listening_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race of a CI run: a port picked free is taken before kube-apiserver binds it. The start
    stops what it began, picks new ports and comes up; etcd restarts on its data dir."""
    from gpupack.devcluster import controlplane as module

    picks: list[int] = []
    real_free_port = module.free_port

    def taken_first(host: str = "127.0.0.1") -> int:
        port = listening_port if not picks else real_free_port(host)
        picks.append(port)
        return port

    monkeypatch.setattr(module, "free_port", taken_first)
    with ControlPlane(control_plane.binaries) as plane:
        assert plane.running()
        assert plane.ports["apiserver"] != listening_port
        assert picks[0] == listening_port and len(picks) > len(plane.ports)
        log = (plane.log_dir / "kube-apiserver.log").read_text()
        assert "address already in use" in log  # the first attempt did meet the clash
        assert plane.server.endswith(f":{plane.ports['apiserver']}")
    assert not plane.processes


def test_failure_inside_the_block_still_tears_down(control_plane: ControlPlane) -> None:
    pids: list[int] = []
    with pytest.raises(RuntimeError, match="test failed"):
        with ControlPlane(control_plane.binaries) as plane:
            pids = [p.pid or 0 for p in plane.processes]
            workdir = plane.workdir
            raise RuntimeError("test failed")
    assert len(pids) == 3
    assert _gone(pids), "components survived stop()"
    assert not workdir.exists()


def test_components_die_with_a_killed_test_process(control_plane: ControlPlane) -> None:
    """A test session killed with SIGKILL (no cleanup runs) leaves no stray processes."""
    script = (
        "import json, sys, time\n"
        "from gpupack.devcluster.binaries import Binaries\n"
        "from gpupack.devcluster.controlplane import ControlPlane\n"
        f"cp = ControlPlane(Binaries(__import__('pathlib').Path({str(control_plane.binaries.bin_dir)!r}))).start()\n"
        "print(json.dumps([p.pid for p in cp.processes]), flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            cwd=REPO)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        pids = json.loads(line)
        assert len(pids) == 3 and all(_running(p) for p in pids)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert _gone(pids), "etcd/kube-apiserver/kube-scheduler outlived their killed parent"


def test_wait_names_what_it_waited_for() -> None:
    with pytest.raises(StartFailed, match="timed out after 0s waiting for the moon"):
        wait_until(lambda: False, "the moon", timeout_s=0.3, interval_s=0.05)


def test_missing_go_says_so_and_how_to_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("GPUPACK_K8S_BIN_DIR", raising=False)
    path = [d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "go").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    with pytest.raises(ToolchainMissing) as info:
        ensure_binaries()
    assert "Go" in str(info.value) and "GPUPACK_SKIP_E2E=1" in str(info.value)


def test_failed_build_reports_exit_status_and_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Go that fails to build (stand-in on PATH) gives BuildFailed with its output."""
    fake = tmp_path / "bin" / "go"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\n[ "$1 $2" = "env GOVERSION" ] && echo go1.26.0 && exit 0\n'
                    'echo "compile: out of cheese" >&2; exit 1\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GPUPACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("GPUPACK_K8S_BIN_DIR", raising=False)
    with open(tmp_path / "progress.txt", "w+") as progress:
        with pytest.raises(BuildFailed) as info:
            ensure_binaries(progress=progress)
        progress.seek(0)
        assert "out of cheese" in progress.read()
    assert "exit status" in str(info.value) and "fix:" in str(info.value)


def test_prebuilt_dir_without_binaries_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPACK_K8S_BIN_DIR", str(tmp_path))
    with pytest.raises(BuildFailed, match="lacks etcd, kube-apiserver, kube-scheduler"):
        ensure_binaries()


def test_cli_up_status_down(control_plane: ControlPlane, tmp_path: Path) -> None:
    env = {**os.environ, "GPUPACK_DEVCLUSTER_DIR": str(tmp_path / "dev"),
           "GPUPACK_K8S_BIN_DIR": str(control_plane.binaries.bin_dir)}

    def gpupack(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpupack", "dev", "cluster", *args],
                              env=env, cwd=REPO, capture_output=True, text=True, timeout=180)

    up = gpupack("up")
    assert up.returncode == 0, up.stderr
    last = up.stdout.strip().splitlines()[-1]
    assert last.startswith("KUBECONFIG=")
    kubeconfig = Path(last.removeprefix("KUBECONFIG="))
    state = json.loads((tmp_path / "dev" / "state.json").read_text())
    components = [Component(**c) for c in state["components"]]
    try:
        assert {c.name for c in components} == {"etcd", "kube-apiserver", "kube-scheduler"}
        assert all(alive(c) for c in components), "up returned but components are not running"
        status = gpupack("status")
        assert status.returncode == 0 and "ready" in status.stdout, status.stdout

        from gpupack.devcluster.clients import api_client
        from kubernetes import client
        with api_client(kubeconfig) as api:
            crds = client.ApiextensionsV1Api(api).list_custom_resource_definition()
            assert "gpunodes.gpupack.io" in {c.metadata.name for c in crds.items}
        again = gpupack("up")
        assert again.returncode == 0 and "already running" in again.stdout
    finally:
        down = gpupack("down")
    assert down.returncode == 0, down.stderr
    assert _gone([c.pid for c in components])
    assert not Path(state["workdir"]).exists()
    after = gpupack("status")
    assert after.returncode == 1 and "not running" in after.stdout
