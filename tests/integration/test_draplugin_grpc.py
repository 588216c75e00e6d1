"""The DRA kubelet plugin as the kubelet meets it: ``gpupack dra-plugin serve`` in its own process,
called over its real unix sockets with the kubelet's generated gRPC stubs.

The node is two SIMULATED H100s (GPU 0 in MIG mode, GPU 1 not; the state file is
what the tests inspect) and the ResourceClaims come from a file the test writes
(there is no API server here). Checked: registration; a MIG claim prepared at
its placement, idempotently, and unprepared; an MPS share's limits in its CDI
spec; a placement held by another claim refused for that claim only; SIGTERM
removing both sockets; and SIGKILL in the middle of a prepare (before the
instance exists, and after it exists but before the plugin recorded it), after
which the restarted plugin leaves no instance behind and the kubelet's retry
succeeds; and the device health stream, from a GPUNode the test writes as the
agent would. Waits are generous and nothing asserts on time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest

from mig.catalog import get_model
from node.kubeletapi import dra_health_v1_pb2 as dra_health
from node.kubeletapi import dra_health_v1_pb2_grpc as dra_health_grpc
from node.kubeletapi import dra_v1_pb2 as dra
from node.kubeletapi import dra_v1_pb2_grpc as dra_grpc
from node.kubeletapi import pluginregistration_v1_pb2 as reg
from node.kubeletapi import pluginregistration_v1_pb2_grpc as reg_grpc
from node.nvml.simulated import SimulatedNvml
from tests.processes import stop_process

ROOT = Path(__file__).resolve().parents[2]
NODE = "node-a"
WAIT_S = 60.0


def wait_for(what: str, check: Callable[[], bool], proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the plugin exited ({proc.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


class Plugin:
    """One simulated node: its files, and the plugin process serving it (restartable)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sim_state = root / "sim.json"
        self.claims_file = root / "claims.json"
        self.cdi_dir = root / "cdi"
        self.journal_dir = root / "plugin" / "state" / "claims"
        self.dra_socket = root / "plugin" / "dra.sock"
        self.registration_socket = root / "registry" / "gpu.gpupack.io-reg.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = root / "plugin.log"
        self.claims: list[dict[str, Any]] = []
        sim = SimulatedNvml(get_model("H100-80GB"), 2, self.sim_state, seed=NODE)
        sim.set_mig_mode(1, False)
        sim.reset_gpu(1)
        self.write_claims()

    def start(self, *extra: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        env = {k: v for k, v in env.items() if not k.startswith("GPUPACK_DRA_")}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gpupack.cli_draplugin", "serve", "--node", NODE,
                 "--simulate", "H100-80GB:2", "--state-file", str(self.sim_state),
                 "--claims-file", str(self.claims_file), "--plugin-dir", str(self.root / "plugin"),
                 "--registration-dir", str(self.root / "registry"), "--cdi-dir", str(self.cdi_dir), *extra],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_for("the plugin to answer GetInfo", self._answers, self.proc)

    def _answers(self) -> bool:
        if not self.registration_socket.exists():
            return False
        try:
            self.info()
        except grpc.RpcError:
            return False
        return True

    def info(self) -> reg.PluginInfo:
        with grpc.insecure_channel(f"unix://{self.registration_socket}") as channel:
            return reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=5)

    def prepare(self, *uids: str) -> dra.NodePrepareResourcesResponse:
        with grpc.insecure_channel(f"unix://{self.dra_socket}") as channel:
            return dra_grpc.DRAPluginStub(channel).NodePrepareResources(
                dra.NodePrepareResourcesRequest(claims=[self.claim(uid) for uid in uids]), timeout=WAIT_S)

    def unprepare(self, *uids: str) -> dra.NodeUnprepareResourcesResponse:
        with grpc.insecure_channel(f"unix://{self.dra_socket}") as channel:
            return dra_grpc.DRAPluginStub(channel).NodeUnprepareResources(
                dra.NodeUnprepareResourcesRequest(claims=[self.claim(uid) for uid in uids]), timeout=WAIT_S)

    def claim(self, uid: str) -> dra.Claim:
        return dra.Claim(namespace="ml", name=f"claim-{uid}", uid=uid)

    def add_claim(self, uid: str, *results: dict[str, Any]) -> None:
        self.claims.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                            "metadata": {"namespace": "ml", "name": f"claim-{uid}", "uid": uid},
                            "status": {"allocation": {"devices": {"results": list(results)}}}})
        self.write_claims()

    def write_claims(self) -> None:
        tmp = self.claims_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": self.claims}))
        os.replace(tmp, self.claims_file)

    def instances(self, gpu: int = 0) -> list[dict[str, Any]]:
        instances: list[dict[str, Any]] = json.loads(self.sim_state.read_text())["gpus"][gpu]["instances"]
        return instances

    def spec(self, uid: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.cdi_dir / f"gpu.gpupack.io-claim_{uid}.json").read_text())
        return data

    def specs(self) -> list[str]:
        return sorted(p.name for p in self.cdi_dir.glob("*.json"))

    def journals(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted(self.journal_dir.glob("*.json"))]

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(WAIT_S)

    def stop(self) -> int:
        assert self.proc is not None
        stop_process(self.proc, grace_s=WAIT_S)
        return self.proc.returncode


@pytest.fixture
def plugin() -> Iterator[Plugin]:
    with tempfile.TemporaryDirectory(prefix="dra.") as tmp:  # short: unix socket paths hold ~107 bytes
        node = Plugin(Path(tmp))
        try:
            yield node
        finally:
            if node.proc is not None and node.proc.poll() is None:
                stop_process(node.proc)


def mig(device: str, request: str = "gpu") -> dict[str, Any]:
    return {"request": request, "driver": "gpu.gpupack.io", "pool": NODE, "device": device}


def test_registration_names_the_dra_socket(plugin: Plugin) -> None:
    plugin.start()
    info = plugin.info()
    assert (info.type, info.name, list(info.supported_versions)) == ("DRAPlugin", "gpu.gpupack.io", ["v1.DRAPlugin"])
    assert info.endpoint == str(plugin.dra_socket) and plugin.dra_socket.is_socket()
    with grpc.insecure_channel(f"unix://{plugin.registration_socket}") as channel:
        reg_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=True), timeout=5)


def test_a_mig_claim_is_prepared_once_and_unprepared(plugin: Plugin) -> None:
    plugin.add_claim("u1", mig("gpu-0-mig-3g-40gb-4"))
    plugin.start()
    first = plugin.prepare("u1")
    entry = first.claims["u1"]
    assert entry.error == ""
    (device,) = entry.devices
    assert (list(device.request_names), device.pool_name, device.device_name, list(device.cdi_device_ids)) == (
        ["gpu"], NODE, "gpu-0-mig-3g-40gb-4", ["gpu.gpupack.io/claim=u1-0"])
    (instance,) = plugin.instances(0)
    assert (instance["profile"], instance["start"], instance["size"]) == ("3g.40gb", 4, 4)
    spec = plugin.spec("u1")
    assert spec["kind"] == "gpu.gpupack.io/claim" and spec["devices"][0]["name"] == "u1-0"
    assert spec["devices"][0]["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={instance['uuid']}"]

    assert plugin.prepare("u1") == first
    assert len(plugin.instances(0)) == 1

    assert plugin.unprepare("u1").claims["u1"].error == ""
    assert plugin.instances(0) == [] and plugin.specs() == [] and plugin.journals() == []
    assert plugin.unprepare("u1").claims["u1"].error == ""  # unknown now: nothing to do


def test_a_whole_gpu_claim_on_a_mig_gpu_gets_the_full_size_instance_through_the_socket(plugin: Plugin) -> None:
    plugin.add_claim("w1", mig("gpu-0"))
    plugin.start()
    entry = plugin.prepare("w1").claims["w1"]
    assert entry.error == "" and [d.device_name for d in entry.devices] == ["gpu-0"]
    (instance,) = plugin.instances(0)
    assert (instance["profile"], instance["start"], instance["size"]) == ("7g.80gb", 0, 8)
    assert plugin.spec("w1")["devices"][0]["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={instance['uuid']}"]
    assert plugin.unprepare("w1").claims["w1"].error == ""
    assert plugin.instances(0) == [] and plugin.specs() == [] and plugin.journals() == []


def test_an_mps_share_gets_its_limits_through_cdi(plugin: Plugin) -> None:
    plugin.add_claim("s1", {**mig("gpu-1-shared"), "shareID": "share-1",
                            "consumedCapacity": {"gpu.gpupack.io/milli": "300", "gpu.gpupack.io/memory": "20Gi"}})
    plugin.start()
    (device,) = plugin.prepare("s1").claims["s1"].devices
    assert device.share_id == "share-1"
    env = plugin.spec("s1")["devices"][0]["containerEdits"]["env"]
    assert env[1:] == ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M"]
    assert env[0].startswith("NVIDIA_VISIBLE_DEVICES=GPU-")


def test_a_placement_held_by_another_claim_fails_only_that_claim(plugin: Plugin) -> None:
    plugin.add_claim("a", mig("gpu-0-mig-1g-10gb-6"))
    plugin.add_claim("b", mig("gpu-0-mig-3g-40gb-4"))
    plugin.add_claim("c", mig("gpu-0-mig-2g-20gb-0"))
    plugin.start()
    assert plugin.prepare("a").claims["a"].error == ""
    response = plugin.prepare("b", "c", "missing")
    assert "prepared for ResourceClaim ml/claim-a (UID a)" in response.claims["b"].error
    assert not response.claims["b"].devices
    assert response.claims["c"].error == "" and response.claims["c"].devices[0].device_name == "gpu-0-mig-2g-20gb-0"
    assert "does not exist" in response.claims["missing"].error
    assert sorted((i["profile"], i["start"]) for i in plugin.instances(0)) == [("1g.10gb", 6), ("2g.20gb", 0)]


def test_sigterm_stops_cleanly_and_removes_both_sockets(plugin: Plugin) -> None:
    plugin.start()
    assert plugin.stop() == 0
    assert not plugin.dra_socket.exists() and not plugin.registration_socket.exists()


def test_sigterm_during_a_stuck_prepare_exits_and_the_restart_rolls_it_back(plugin: Plugin) -> None:
    plugin.add_claim("u1", mig("gpu-0-mig-1g-10gb-6"))
    plugin.start("--simulate-delay-seconds", "600", "--shutdown-grace-seconds", "1")
    channel = grpc.insecure_channel(f"unix://{plugin.dra_socket}")
    call = dra_grpc.DRAPluginStub(channel).NodePrepareResources.future(
        dra.NodePrepareResourcesRequest(claims=[plugin.claim("u1")]), timeout=WAIT_S * 10)
    wait_for("the create intent in the journal", lambda: any(
        d.get("creating") for j in plugin.journals() for d in j["devices"]), plugin.proc)
    assert plugin.stop() == 0
    assert not plugin.dra_socket.exists() and not plugin.registration_socket.exists()
    with pytest.raises(grpc.RpcError):
        call.result()
    channel.close()
    plugin.start()
    assert plugin.journals() == [] and plugin.instances(0) == []
    assert plugin.prepare("u1").claims["u1"].error == ""


@pytest.mark.parametrize(("flag", "moment"), [
    ("--simulate-delay-seconds", "before the instance exists"),
    ("--simulate-pause-after-create", "after the instance exists, before the plugin recorded it"),
], ids=["before-create", "after-create"])
def test_sigkill_in_the_middle_of_a_prepare_is_recovered_at_restart(plugin: Plugin, flag: str, moment: str) -> None:
    plugin.add_claim("u1", mig("gpu-0-mig-4g-40gb-0"), mig("gpu-0-mig-1g-10gb-6", "small"))
    plugin.start(flag, "600")
    channel = grpc.insecure_channel(f"unix://{plugin.dra_socket}")
    call = dra_grpc.DRAPluginStub(channel).NodePrepareResources.future(
        dra.NodePrepareResourcesRequest(claims=[plugin.claim("u1")]), timeout=WAIT_S * 10)
    if flag == "--simulate-delay-seconds":
        wait_for("the create intent in the journal", lambda: any(
            d.get("creating") for j in plugin.journals() for d in j["devices"]), plugin.proc)
    else:
        wait_for("the first instance", lambda: len(plugin.instances(0)) == 1, plugin.proc)
    plugin.kill()
    with pytest.raises(grpc.RpcError):
        call.result()
    channel.close()
    assert plugin.journals()[0]["phase"] == "Preparing", moment

    plugin.start()
    assert plugin.instances(0) == [], f"killed {moment}: the restarted plugin left an instance behind"
    assert plugin.journals() == [] and plugin.specs() == []
    entry = plugin.prepare("u1").claims["u1"]
    assert entry.error == "" and [d.device_name for d in entry.devices] == ["gpu-0-mig-4g-40gb-0", "gpu-0-mig-1g-10gb-6"]
    assert sorted((i["profile"], i["start"]) for i in plugin.instances(0)) == [("1g.10gb", 6), ("4g.40gb", 0)]
    assert plugin.stop() == 0


def test_the_plugin_runs_the_mps_daemon_for_its_mig_off_gpus_and_quits_it_on_stop(plugin: Plugin) -> None:
    program = plugin.root / "mps-control"
    fake = ROOT / "tests" / "fixtures" / "fake_mps_control.py"
    program.write_text(f"#!/bin/sh\nexec {sys.executable} {fake} \"$@\"\n")
    program.chmod(0o755)
    pipes = plugin.root / "mps"
    plugin.add_claim("s1", {**mig("gpu-1-shared"), "shareID": "share-1",
                            "consumedCapacity": {"gpu.gpupack.io/milli": "300", "gpu.gpupack.io/memory": "20Gi"}})
    plugin.start("--run-mps-daemon", "--mps-pipe-dir", str(pipes), "--mps-control-binary", str(program))
    assert (pipes / "control").exists()
    gpu1 = json.loads(plugin.sim_state.read_text())["gpus"][1]["uuid"]
    assert (pipes / "devices").read_text() == gpu1  # GPU 0 has MIG on: not the daemon's
    plugin.prepare("s1")
    assert f"CUDA_MPS_PIPE_DIRECTORY={pipes}" in plugin.spec("s1")["devices"][0]["containerEdits"]["env"]
    assert plugin.stop() == 0
    assert not (pipes / "control").exists()


def test_run_mps_daemon_without_a_pipe_directory_is_refused_before_anything_starts(plugin: Plugin) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPACK_DRA_")}
    done = subprocess.run([sys.executable, "-m", "gpupack.cli_draplugin", "serve", "--node", NODE,
                           "--simulate", "H100-80GB:2", "--run-mps-daemon", "--plugin-dir", str(plugin.root / "p"),
                           "--registration-dir", str(plugin.root / "r")],
                          cwd=ROOT, env=dict(env, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "run_mps_daemon needs share_mode mps and an mps_pipe_directory" in done.stderr


def write_gpunode(path: Path, gpu1_fault: dict[str, Any] | None) -> None:
    """The GPUNode as the agent writes it: both GPUs, GPU 1 with ``gpu1_fault`` when given."""
    gpus: list[dict[str, Any]] = [{"index": 0, "migEnabled": True, "instances": []},
                                  {"index": 1, "migEnabled": False, "instances": []}]
    if gpu1_fault is not None:
        gpus[1]["health"] = gpu1_fault
    heartbeat = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    obj = {"apiVersion": "gpupack.io/v1alpha1", "kind": "GPUNode", "metadata": {"name": NODE},
           "status": {"product": "NVIDIA-H100-80GB-HBM3", "heartbeatTime": heartbeat, "gpus": gpus}}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def test_the_health_stream_tells_the_kubelet_a_prepared_device_failed(plugin: Plugin) -> None:
    gpunode_file = plugin.root / "gpunode.json"
    write_gpunode(gpunode_file, None)
    plugin.add_claim("s1", {**mig("gpu-1-shared"), "shareID": "share-1",
                            "consumedCapacity": {"gpu.gpupack.io/milli": "300", "gpu.gpupack.io/memory": "20Gi"}})
    plugin.start("--gpunode-file", str(gpunode_file), "--health-interval-seconds", "0.2")
    assert list(plugin.info().supported_versions) == ["v1.DRAPlugin", "v1.DRAResourceHealth"]

    with grpc.insecure_channel(f"unix://{plugin.dra_socket}") as channel:
        stream = dra_health_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            dra_health.NodeWatchResourcesRequest(), timeout=WAIT_S)
        assert list(next(stream).devices) == []  # nothing prepared yet
        assert plugin.prepare("s1").claims["s1"].error == ""

        def next_for_device() -> Any:
            for message in stream:
                if message.devices:
                    (device,) = message.devices
                    return device
            raise AssertionError("the health stream ended")

        device = next_for_device()
        assert (device.device.pool_name, device.device.device_name, device.health) == (
            NODE, "gpu-1-shared", dra_health.HEALTHY)

        write_gpunode(gpunode_file, {"reason": "Xid79", "message": "GPU has fallen off the bus",
                                     "since": "2026-12-02T12:00:00Z", "recovery": "RebootNode"})
        while device.health == dra_health.HEALTHY:
            device = next_for_device()
        assert device.health == dra_health.UNHEALTHY
        assert "Xid79" in device.message and "fallen off the bus" in device.message

        # The admin's view: gpupack dra-plugin call health, as JSON.
        out = subprocess.run([sys.executable, "-m", "gpupack.cli_draplugin", "call", "health", "--socket",
                              str(plugin.dra_socket)], cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S)
        assert out.returncode == 0, out.stderr
        (listed,) = json.loads(out.stdout.splitlines()[0])
        assert (listed["device"], listed["health"]) == ("gpu-1-shared", "UNHEALTHY")

        # A plugin stopping with a stream open ends the stream and still stops cleanly.
        assert plugin.stop() == 0
        try:
            for _ in stream:
                pass
        except grpc.RpcError as exc:  # the connection went with the plugin: fine, but not the stream's deadline
            assert exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED, "the stream outlived the plugin"
    assert not plugin.dra_socket.exists() and not plugin.registration_socket.exists()
