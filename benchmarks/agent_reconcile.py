#!/usr/bin/env python3
"""Node-agent benchmark on the SIMULATED backend and a real local control plane.

1. Reconcile latency: GPUNode spec change -> Node allocatable shows the new MIG
   resources (journal, NVML steps, device-plugin pause/resume, emulated
   re-advertisement, all through the real API server), alternating two layouts.
2. Idle cost: the agent as its own process (``gpupack agent run``) with 8
   simulated GPUs and default settings, idle for ``--idle-seconds``: CPU seconds
   per minute and resident memory, from /proc.

    python benchmarks/agent_reconcile.py [--reshapes 20] [--idle-seconds 60]

Needs the control-plane binaries (tools/k8s/build.sh, cached). Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes import client  # noqa: E402

from gpupack.devcluster.apply import apply_objects, gpupack_manifests  # noqa: E402
from gpupack.devcluster.binaries import ensure_binaries  # noqa: E402
from gpupack.devcluster.controlplane import ControlPlane  # noqa: E402

LAYOUTS = (["3g.71gb", "3g.71gb"], ["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"])


def _node(core: client.CoreV1Api, name: str) -> None:
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(
        name=name, labels={"nvidia.com/gpu.deploy.device-plugin": "true"})))
    res = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    core.patch_node_status(name, {"status": {"capacity": res, "allocatable": res}})


def _expected(layout: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in layout:
        out[f"nvidia.com/mig-{p}"] = str(int(out.get(f"nvidia.com/mig-{p}", "0")) + 1)
    return out


def latency(cp: ControlPlane, admin: Any, reshapes: int) -> dict[str, Any]:
    from gpupack.cli_agent import open_backend
    from node.agent import Agent
    from node.base.kube import Kube
    from node.base.settings import AgentSettings

    core, custom = client.CoreV1Api(admin), client.CustomObjectsApi(admin)
    node = "bench-latency"
    _node(core, node)
    settings = AgentSettings(node_name=node, simulate="H200:1", emulate_device_plugin=True, idle_seconds=0.0,
                             metrics_port=0)  # default poll (5 s) and patch rate limits
    backend, _ = open_backend(settings)
    agent = Agent(settings, backend, Kube.connect(str(cp.serviceaccount_kubeconfig("gpupack-node-agent"))))
    stop = {"flag": False}
    thread = threading.Thread(target=agent.run_forever, args=(lambda: stop["flag"],), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            custom.get_cluster_custom_object("gpupack.io", "v1alpha1", "gpunodes", node)
            break
        except client.ApiException:
            time.sleep(0.1)
    samples = []
    for i in range(reshapes):
        layout = LAYOUTS[i % 2]
        want = _expected(layout)
        began = time.monotonic()
        custom.patch_cluster_custom_object("gpupack.io", "v1alpha1", "gpunodes", node, {"spec": {"gpus": [
            {"index": 0, "migEnabled": True, "layout": [{"profile": p} for p in layout]}]}})
        while True:
            alloc = core.read_node(node).status.allocatable or {}
            shown = {k: v for k, v in alloc.items() if k.startswith("nvidia.com/mig-") and v != "0"}
            if shown == want:
                break
            if time.monotonic() - began > 60:
                raise SystemExit(f"reshape {i} did not show up within 60 s: {shown} != {want}")
            time.sleep(0.02)
        samples.append(time.monotonic() - began)
    stop["flag"] = True
    thread.join(timeout=15)
    samples.sort()
    return {"reshapes": reshapes, "p50_s": round(statistics.median(samples), 3),
            "p95_s": round(samples[max(0, int(0.95 * len(samples)) - 1)], 3), "max_s": round(samples[-1], 3),
            "mean_s": round(statistics.fmean(samples), 3)}


def _proc_times(pid: int) -> tuple[float, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    rss_kib = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS:"))
    return cpu, rss_kib


def idle_cost(cp: ControlPlane, admin: Any, seconds: float) -> dict[str, Any]:
    node = "bench-idle"
    _node(client.CoreV1Api(admin), node)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "gpupack", "agent", "run", "--node", node, "--simulate", "H200:8",
               "--state-file", str(Path(tmp) / "s.json"), "--emulate-device-plugin", "--metrics-port", "0",
               "--kubeconfig", str(cp.serviceaccount_kubeconfig("gpupack-node-agent"))]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(10)  # start-up, first inventory, first patches
            cpu0, _ = _proc_times(proc.pid)
            t0 = time.monotonic()
            time.sleep(seconds)
            cpu1, rss = _proc_times(proc.pid)
            elapsed = time.monotonic() - t0
        finally:
            proc.terminate()
            proc.wait(timeout=20)
    return {"gpus": 8, "idle_s": round(elapsed, 1), "cpu_s_per_min": round((cpu1 - cpu0) / elapsed * 60, 3),
            "cpu_percent_of_one_core": round((cpu1 - cpu0) / elapsed * 100, 2), "rss_mib": round(rss / 1024, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reshapes", type=int, default=20)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    args = parser.parse_args()
    with ControlPlane(ensure_binaries()) as cp:
        with cp.admin_client() as admin:
            apply_objects(admin, gpupack_manifests(), field_manager="gpupack-bench")
            result = {"machine": f"{os.cpu_count()} CPUs", "backend": "simulated NVML + emulated device plugin",
                      "reconcile_latency": latency(cp, admin, args.reshapes),
                      "idle": idle_cost(cp, admin, args.idle_seconds)}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
