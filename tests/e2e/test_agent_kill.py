"""SIGKILL the agent process in the middle of a reshape; a new agent process finishes it.

The agent runs as ``gpupack agent run`` (its own process, as in the DaemonSet) on a
simulated H200 whose instance creates and destroys take a while, so the kill lands
between NVML steps. The journal in ``GPUNode.status`` and the state file are all
the new process gets.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.e2e.test_agent_e2e import _allocatable, _gpunode, _set_spec, _wait

REPO = Path(__file__).resolve().parents[2]


def _agent(node: str, state: Path, kubeconfig: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GPUPACK_AGENT_SIMULATE_DELAY_SECONDS": "0.6", "GPUPACK_AGENT_POLL_SECONDS": "0.5",
           "GPUPACK_AGENT_MIN_PATCH_SECONDS": "0.2", "GPUPACK_AGENT_IDLE_SECONDS": "0"}
    return subprocess.Popen(
        [sys.executable, "-m", "gpupack", "agent", "run", "--node", node, "--simulate", "H200:1",
         "--state-file", str(state), "--emulate-device-plugin", "--metrics-port", "0", "--kubeconfig", str(kubeconfig)],
        cwd=REPO, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def test_sigkill_mid_reshape_is_finished_by_the_next_agent(
    admin_client: Any, agent_kubeconfig: Callable[[str], Path], tmp_path: Path,
) -> None:
    core = client.CoreV1Api(admin_client)
    node = f"kill-{uuid.uuid4().hex[:6]}"
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(
        name=node, labels={"nvidia.com/gpu.deploy.device-plugin": "true"})))
    state, log = tmp_path / "gpus.json", tmp_path / "agent.log"
    kubeconfig = agent_kubeconfig(node)  # a token bound to a pod on its node: node isolation is on
    first = _agent(node, state, kubeconfig, log)
    try:
        _wait("status", lambda: (_gpunode(admin_client, node).get("status") or {}).get("gpus"))
        _set_spec(admin_client, node, {0: ["7g.141gb"]})
        _wait("7g advertised", lambda: _allocatable(admin_client, node).get("nvidia.com/mig-7g.141gb") == "1", 60)
        _set_spec(admin_client, node, {0: ["1g.18gb"] * 7})
        # Kill once the journal shows the destroy and at least one create done.
        _wait("reshape half done", lambda: (r := (_gpunode(admin_client, node).get("status") or {})
                                            .get("reconfiguration") or {})
              and r.get("phase") == "Applying" and r.get("step", 0) >= 2, 60)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    half = _gpunode(admin_client, node)["status"]["reconfiguration"]
    assert half["phase"] == "Applying" and 2 <= half["step"] < 8, half
    assert core.read_node(node).metadata.labels["nvidia.com/gpu.deploy.device-plugin"] == "paused-for-mig-change"  # type: ignore[union-attr,index]

    second = _agent(node, state, kubeconfig, log)
    try:
        obj = _wait("journal finished by the new agent", lambda: (o := _gpunode(admin_client, node))
                    and o["status"]["reconfiguration"]["phase"] == "Succeeded" and o, 90)
        assert obj["status"]["reconfiguration"]["targetGeneration"] == obj["metadata"]["generation"]
        _wait("inventory shows seven 1g", lambda: sorted(
            i["profile"] for i in _gpunode(admin_client, node)["status"]["gpus"][0]["instances"]) == ["1g.18gb"] * 7)
        _wait("new layout advertised", lambda: _allocatable(admin_client, node).get("nvidia.com/mig-1g.18gb") == "7")
        labels: Any = core.read_node(node).metadata.labels  # type: ignore[union-attr]
        assert labels["nvidia.com/gpu.deploy.device-plugin"] == "true"
        assert _allocatable(admin_client, node).get("nvidia.com/mig-7g.141gb") == "0"
    finally:
        second.terminate()
        assert second.wait(timeout=30) == 0, log.read_text()[-3000:]
