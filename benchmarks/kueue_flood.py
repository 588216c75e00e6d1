"""The 3,000-pod flood (issue 36): how long another tenant's pod waits to be bound, with and without Kueue.

One tenant (namespace ``flood``) creates ``--pods`` pods of 1 milli each, as fast as ``--threads``
clients can; then another tenant (namespace ``other``) creates one pod of 250 milli, and the run
measures the seconds from its creation until kube-scheduler bound it (``spec.nodeName``), or gives
up after ``--wait-timeout``. The cluster: the whole stack of ``gpupack demo`` (real control plane,
gpupack's webhook, agents on simulated NVML, the controller) with ``--nodes`` nodes of 8 x A100
shared by MPS into 4 replicas (32 replicas each).

* ``--mode none``: no Kueue. Every flood pod is demand; each takes a whole replica, oldest first.
* ``--mode kueue``: Kueue runs (``ControlPlaneConfig(kueue=...)``); the flood's pods are queued to a
  ClusterQueue of ``--flood-quota`` milli (each replica counts 250), the other tenant's to one of
  1000. Kueue admits the flood up to its quota and holds the rest at its gate, which gpupack does
  not plan for (``Pod.queue_held``).

Not a test: it asserts nothing and its figures depend on the machine (benchmarks/kueue_flood.md
says which produced them). The order (the other tenant bound while the held flood stays gated) is
asserted by tests/e2e/test_kueue_e2e.py.

    PYTHONPATH=. python3 benchmarks/kueue_flood.py --mode kueue --out benchmarks/kueue_flood.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client

from gpupack.demo.stack import DemoNode, Stack
from gpupack.devcluster.apply import apply_objects
from gpupack.devcluster.binaries import ensure_kueue
from gpupack.devcluster.clients import api_client
from gpupack.testing.admission_reviews import gpu_container, make_pod
from kube.times import parse_time
from sharing.api.keys import KUEUE_ADMISSION_GATE, KUEUE_QUEUE_LABEL

QUEUE = "gpus"
FLOOD, OTHER = "flood", "other"


def _queues(flood_quota: int) -> list[dict[str, Any]]:
    def cluster_queue(name: str, milli: int) -> dict[str, Any]:
        return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name},
                "spec": {"namespaceSelector": {}, "resourceGroups": [{
                    "coveredResources": ["gpupack.io/gpu-milli"],
                    "flavors": [{"name": "gpupack-gpus", "resources": [
                        {"name": "gpupack.io/gpu-milli", "nominalQuota": str(milli)}]}]}]}}

    def local_queue(namespace: str) -> dict[str, Any]:
        return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                "metadata": {"name": QUEUE, "namespace": namespace}, "spec": {"clusterQueue": namespace}}

    return [{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "gpupack-gpus"}},
            cluster_queue(FLOOD, flood_quota), cluster_queue(OTHER, 1000), local_queue(FLOOD), local_queue(OTHER)]


def _pod(namespace: str, name: str, milli: int, queued: bool) -> Any:
    labels = {KUEUE_QUEUE_LABEL: QUEUE} if queued else {}
    return make_pod(gpu_container("main", str(milli)), name=name, namespace=namespace, mode="mps", labels=labels)


def _workload_created_after(admin: Any, core: Any) -> int | None:
    """Seconds (whole: the API's timestamps) from the other tenant's pod's creation to its Workload's:
    how long Kueue's pod controller took to get to it."""
    pod: Any = core.read_namespaced_pod("tenant-pod", OTHER)
    listed: Any = client.CustomObjectsApi(admin).list_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", OTHER, "workloads")
    stamps = [parse_time(w["metadata"]["creationTimestamp"]) for w in listed.get("items", [])]
    created = [s for s in stamps if s is not None]
    if not created or pod.metadata.creation_timestamp is None:
        return None
    return int(round((min(created) - pod.metadata.creation_timestamp).total_seconds()))


def run(mode: str, pods: int, nodes: int, flood_quota: int, threads: int, wait_timeout: float,
        workdir: Path, kueue_qps: int = 50) -> dict[str, Any]:
    queued = mode == "kueue"
    kueue = ensure_kueue(progress=sys.stderr) if queued else None
    stack = Stack(workdir, nodes=tuple(DemoNode(f"flood-{i}", "A100-80GB", 8, sharing="mps", replicas=4)
                                       for i in range(nodes)), kueue=kueue, probe_sharing="mps",
                  kueue_qps=kueue_qps)
    try:
        stack.start(lambda line: print(line, file=sys.stderr))
        assert stack.plane is not None
        core = client.CoreV1Api(stack.admin)
        for namespace in (FLOOD, OTHER):
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        if queued:
            apply_objects(stack.admin, _queues(flood_quota))
        flooders = [api_client(stack.plane.kubeconfig) for _ in range(threads)]

        def create(i: int) -> None:
            client.CoreV1Api(flooders[i % threads]).create_namespaced_pod(FLOOD, _pod(FLOOD, f"f{i:05d}", 1, queued))

        began = time.monotonic()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(create, range(pods)))
        flood_s = time.monotonic() - began
        print(f"flood: {pods} pods created in {flood_s:.1f}s", file=sys.stderr)
        core.create_namespaced_pod(OTHER, _pod(OTHER, "tenant-pod", 250, queued))
        created = time.monotonic()
        waited: float | None = None
        admitted: float | None = None  # Kueue lifted its gate (kueue mode)
        while time.monotonic() - created < wait_timeout:
            pod: Any = core.read_namespaced_pod("tenant-pod", OTHER)
            if admitted is None and KUEUE_ADMISSION_GATE not in {g.name for g in pod.spec.scheduling_gates or []}:
                admitted = time.monotonic() - created
            if pod.spec.node_name:
                waited = time.monotonic() - created
                break
            time.sleep(0.2)
        workload_s = _workload_created_after(stack.admin, core) if queued else None
        listed: list[Any] = core.list_namespaced_pod(FLOOD).items
        bound = sum(1 for p in listed if p.spec.node_name)
        held = sum(1 for p in listed if KUEUE_ADMISSION_GATE in {g.name for g in p.spec.scheduling_gates or []})
        return {"mode": mode, "pods": pods, "nodes": nodes, "replicas": nodes * 32,
                "flood_quota_milli": flood_quota if queued else None, "kueue_qps": kueue_qps if queued else None, "flood_created_s": round(flood_s, 1),
                "other_wait_s": None if waited is None else round(waited, 2), "wait_timeout_s": wait_timeout,
                "other_admitted_s": round(admitted, 2) if queued and admitted is not None else None,
                "other_workload_created_s": workload_s,
                "flood_bound": bound, "flood_held_by_kueue": held}
    finally:
        stack.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("none", "kueue"), required=True)
    parser.add_argument("--pods", type=int, default=3000, help="flood pods of 1 milli (default 3000)")
    parser.add_argument("--nodes", type=int, default=2, help="nodes of 8 A100 x 4 replicas (default 2)")
    parser.add_argument("--flood-quota", type=int, default=8000,
                        help="the flood's ClusterQueue quota in gpu-milli (default 8000: 32 replicas)")
    parser.add_argument("--threads", type=int, default=8, help="clients creating the flood (default 8)")
    parser.add_argument("--wait-timeout", type=float, default=180.0, help="seconds to wait for the other pod")
    parser.add_argument("--kueue-qps", type=int, default=50,
                        help="Kueue's API request rate, burst twice that (default 50, as Kueue ships)")
    parser.add_argument("--out", type=Path, default=None, help="append the result to this JSON list")
    args = parser.parse_args()
    if min(args.pods, args.nodes, args.threads, args.flood_quota, args.kueue_qps) < 1:
        parser.error("--pods, --nodes, --threads, --flood-quota and --kueue-qps must be at least 1")
    with tempfile.TemporaryDirectory(prefix="gpupack-kueue-flood-") as tmp:
        result = run(args.mode, args.pods, args.nodes, args.flood_quota, args.threads, args.wait_timeout, Path(tmp),
                     args.kueue_qps)
    print(json.dumps(result))
    if args.out is not None:
        previous = json.loads(args.out.read_text()) if args.out.exists() else []
        args.out.write_text(json.dumps([*previous, result], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
