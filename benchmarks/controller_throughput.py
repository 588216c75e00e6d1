"""Controller throughput at 200 simulated nodes: pods per second planned, released and bound.

Two measurements:

* ``plan``: the pure planning cycle (snapshot -> plan) in-process, for a burst
  of gated MIG and MPS pods over 200 nodes of 8 H100 GPUs each. This is the
  controller's own CPU cost per pod.
* ``live``: the real control plane (kube-apiserver, etcd, kube-scheduler),
  200 Node + GPUNode objects whose status (and the Node's allocatable, as the
  device plugin would advertise it) is written by this script instead of 200
  agent processes, a ``gpupack controller run`` subprocess, and a burst of
  gated pods carrying the webhook's allocation annotation. Timed from the first
  pod creation until every pod is bound by kube-scheduler; reported as pods/s.

    python benchmarks/controller_throughput.py --mode plan --pods 2000
    python benchmarks/controller_throughput.py --mode live --pods 400
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.state.snapshot import Gpu, Node, Pod, Snapshot  # noqa: E402
from sharing.api.keys import ALLOCATION_ANNOTATION  # noqa: E402
from sharing.rules.node_policy import NodePolicy  # noqa: E402
from controller.planning.planner import plan  # noqa: E402
from mig.catalog import get_model  # noqa: E402
from mig.geometry import fits  # noqa: E402
from sharing.api.allocation import Allocation, ContainerAllocation  # noqa: E402

H100 = get_model("H100-80GB")
LAYOUTS = (("1g.10gb",) * 7, ("2g.20gb", "2g.20gb", "3g.40gb"), ("3g.40gb", "4g.40gb"), ("1g.10gb",) * 3 + ("4g.40gb",))
PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb")


def _layout(i: int) -> tuple[Any, ...]:
    placed = fits(H100, LAYOUTS[i % len(LAYOUTS)])
    assert placed is not None
    return placed


def pure(nodes: int, pods: int, repeats: int) -> dict[str, Any]:
    now = datetime(2026, 11, 30, tzinfo=timezone.utc)
    node_list = []
    for n in range(nodes):
        if n % 10 == 9:  # a tenth of the nodes share their GPUs by MPS x4
            gpus = tuple(Gpu(g, H100.memory_mib, False, utilization_percent=30) for g in range(8))
            node_list.append(Node(f"n{n:03d}", H100.product, H100, (("pool", "a"),), "mps", 4, gpus, spec_sharing="mps", spec_replicas=4))
        else:
            gpus = tuple(Gpu(g, H100.memory_mib, True, _layout(n * 8 + g), idle_since=now - timedelta(hours=1)) for g in range(8))
            node_list.append(Node(f"n{n:03d}", H100.product, H100, (("pool", "a"),), "none", 1, gpus))
    pod_list = []
    for i in range(pods):
        created = now - timedelta(seconds=pods - i)
        if i % 5 == 4:
            pod_list.append(Pod("bench", f"s{i}", "mps", created, milli=(200,), memory_bytes=(None,), gated=True))
        else:
            pod_list.append(Pod("bench", f"m{i}", "mig", created, profiles=(PROFILES[i % 4],), milli=(100,), memory_bytes=(None,), gated=True))
    policy = NodePolicy(names=("bench",), max_concurrent=16, idle_seconds=60)
    snap = Snapshot(tuple(node_list), tuple(pod_list), {n.name: policy for n in node_list})
    times = []
    result = None
    for _ in range(repeats):
        began = time.perf_counter()
        result = plan(snap, now)
        times.append(time.perf_counter() - began)
    assert result is not None
    best = min(times)
    return {"mode": "plan", "nodes": nodes, "gpus": nodes * 8, "pods": pods, "released": len(result.releases),
            "layouts": len(result.layouts), "waiting": len(result.waiting),
            "cycle_seconds_median": statistics.median(times), "pods_per_second": pods / statistics.median(times),
            "cycle_seconds_best": best}


def live(nodes: int, pods: int) -> dict[str, Any]:
    import subprocess
    import tempfile

    from kubernetes import client

    from gpupack.devcluster.apply import apply_objects, gpupack_manifests
    from gpupack.devcluster.binaries import ensure_binaries
    from gpupack.devcluster.controlplane import ControlPlane

    plane = ControlPlane(ensure_binaries(progress=sys.stderr)).start()
    tmp = Path(tempfile.mkdtemp(prefix="gpupack-bench-"))
    admin = plane.admin_client()
    try:
        apply_objects(admin, gpupack_manifests(), field_manager="bench")
        core, custom = client.CoreV1Api(admin), client.CustomObjectsApi(admin)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="bench")))
        core.create_namespaced_service_account("bench", client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="default")))

        def make(n: int) -> None:
            name = f"sim-{n:03d}"
            layout = [_layout(n * 8 + g) for g in range(8)]
            counts: dict[str, int] = {}
            for gl in layout:
                for inst in gl:
                    counts[inst.profile] = counts.get(inst.profile, 0) + 1
            core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name, labels={
                "kubernetes.io/hostname": name, "nvidia.com/gpu.product": H100.product, "bench": "on"})))
            alloc = {"cpu": "64", "memory": "512Gi", "pods": "250", **{f"nvidia.com/mig-{p}": str(c) for p, c in counts.items()}}
            core.patch_node_status(name, {"status": {"capacity": alloc, "allocatable": alloc, "conditions": [
                {"type": "Ready", "status": "True", "reason": "Bench", "message": "simulated"}]}})
            custom.create_cluster_custom_object("gpupack.io", "v1alpha1", "gpunodes", {
                "apiVersion": "gpupack.io/v1alpha1", "kind": "GPUNode", "metadata": {"name": name}})
            status = {"product": H100.product, "gpus": [
                {"index": g, "uuid": f"GPU-{n}-{g}", "product": H100.product, "memoryMiB": H100.memory_mib, "migEnabled": True,
                 "instances": [{"profile": i.profile, "start": i.placement.start, "size": i.placement.size} for i in gl]}
                for g, gl in enumerate(layout)]}
            custom.patch_cluster_custom_object_status("gpupack.io", "v1alpha1", "gpunodes", name, {"status": status})

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(make, range(nodes)))
        kc = plane.serviceaccount_kubeconfig("gpupack-controller")
        log = (tmp / "controller.log").open("wb")
        ctl = subprocess.Popen([sys.executable, "-m", "gpupack", "controller", "run", "--kubeconfig", str(kc),
                                "--metrics-port", "0", "--resync-seconds", "2", "--batch-seconds", "0.2"],
                               stdout=log, stderr=subprocess.STDOUT)
        time.sleep(4)  # controller connected and leading

        def body(i: int) -> Any:
            profile = PROFILES[i % 4]
            allocation = Allocation(
                mode="mig", gated=True, capacity_existed=False, policy="bench", reason="bench",
                containers=(ContainerAllocation("c", "containers", 100, None, f"nvidia.com/mig-{profile}", profile),),
            ).to_annotation()
            return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"b{i:05d}", "annotations": {ALLOCATION_ANNOTATION: allocation}},
                    "spec": {"schedulingGates": [{"name": "gpupack.io/capacity"}], "containers": [
                        {"name": "c", "image": "x", "resources": {"limits": {f"nvidia.com/mig-{profile}": "1"}}}]}}

        began = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: core.create_namespaced_pod("bench", body(i)), range(pods)))
        created = time.perf_counter() - began
        while True:
            items = json.loads(core.list_namespaced_pod("bench", _preload_content=False).data)["items"]
            bound = sum(1 for p in items if (p.get("spec") or {}).get("nodeName"))
            if bound >= pods or time.perf_counter() - began > 600:
                break
            time.sleep(0.25)
        elapsed = time.perf_counter() - began
        ctl.terminate()
        ctl.wait(10)
        return {"mode": "live", "nodes": nodes, "gpus": nodes * 8, "pods": pods, "bound": bound,
                "create_seconds": round(created, 2), "seconds_to_all_bound": round(elapsed, 2),
                "pods_per_second": round(bound / elapsed, 1)}
    finally:
        admin.close()
        plane.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["plan", "live"], default="plan")
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    result = pure(args.nodes, args.pods, args.repeats) if args.mode == "plan" else live(args.nodes, args.pods)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
