"""The controller's recommender at 10,000 pods: CPU per cycle, average cores, peak memory (issue 35, item 7).

What is timed is the controller's recommender path whole, ``controller.recommending.RecommenderCycle.run``,
against an in-memory stand-in for the watch caches and the API server: the GPUNodes as the
controller's informer holds them (parsed JSON, each with its agent's ``status.usage``: one
record per pod, a day of history), the pods (each a replica of a Deployment), one namespace, no
SharingPolicy. One cycle decodes the published histories (only those of GPUNodes that
published anew since the last cycle), rebuilds each workload container's history from its pods,
asks the recommender, and decides which ``GPURecommendation`` statuses to write; the stand-in
takes the writes.

The cluster: ``--pods`` pods, ``--replicas`` per Deployment, ``--pods-per-node`` per GPUNode.
Each pod's history is a day of one sample a minute: mostly idle, bursts to 60-100 % in 1 % of
minutes (the GenTD26 trace's shape: docs/usage.md), memory 17-47 GB with hourly peaks.

Cycles:

* ``cold``: a new leader's first cycle: every object read, every record decoded, every workload
  written (its object created);
* ``steady``: a cycle at the default interval (60 s) with the agents' default publication interval
  (300 s): one GPUNode in five has published anew; writes only where something changed.

``cores`` is the average of CPU seconds per cycle over the interval (``steady`` mean CPU / 60 s): what
the recommender costs the controller's process over time. CPU is ``time.process_time`` (the
process, every thread): the VM is shared, so wall time is stretched by others' load. ``rss_mib``
is the process's peak resident memory (``ru_maxrss``), the caches' objects included.

    python benchmarks/recommender_cost.py                    # 10,000 pods; writes recommender_cost.json
    python benchmarks/recommender_cost.py --pods 1000 --no-write
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controller.recommending import RecommenderCycle  # noqa: E402
from controller.settings import ControllerSettings  # noqa: E402
from sharing.api.crd import NodeUsage, PodUsage, to_wire  # noqa: E402
from sharing.usage.compact import LimitHits, encode  # noqa: E402
from sharing.usage.recommender import ContainerHistory, RecommenderSettings  # noqa: E402

GIB = 1024**3
DAY_MINUTES = 24 * 60
T0 = 1.8e9
INTERVAL_S = 60.0
PUBLISH_S = 300.0


def pod_record(namespace: str, name: str, rng: random.Random, settings: RecommenderSettings) -> PodUsage:
    history = ContainerHistory(settings)
    base = rng.uniform(17, 40) * GIB
    for minute in range(DAY_MINUTES):
        duty = rng.uniform(60, 100) if rng.random() < 0.01 else rng.choice((0.0, 0.0, 0.0, 2.0, 5.0, 9.0))
        history.observe(T0 + 60 * minute, duty, int(base + rng.uniform(0, 7) * GIB))
    value = encode(history, LimitHits(), 81559)
    return PodUsage(pod=f"{namespace}/{name}", uid=f"uid-{name}", container="main", **dict(value))


class Cluster:
    """The watch caches' objects and the API server's answers to the recommender's writes."""

    def __init__(self, pods: int, replicas: int, per_node: int, seed: int = 1) -> None:
        rng = random.Random(seed)
        settings = RecommenderSettings()
        # A day of samples is the slow part of building the cluster: a few hundred distinct
        # histories, each used by many pods (the decoding cost is per record all the same).
        templates = [pod_record("ns", "t", rng, settings) for _ in range(min(pods, 200))]
        self.pods: list[dict[str, Any]] = []
        records: list[dict[str, Any]] = []
        for i in range(pods):
            deployment, replica = divmod(i, replicas)
            rs = f"app-{deployment}-6b7c8"
            name = f"{rs}-{replica}"
            self.pods.append({"metadata": {
                "namespace": "ns", "name": name, "uid": f"uid-{name}", "labels": {"pod-template-hash": "6b7c8"},
                "ownerReferences": [{"kind": "ReplicaSet", "name": rs, "controller": True, "uid": "x"}]},
                "spec": {"nodeName": f"node-{i // per_node}"}})
            records.append({**to_wire(templates[i % len(templates)]), "pod": f"ns/{name}", "uid": f"uid-{name}"})
        self.gpunodes: list[dict[str, Any]] = []
        for n in range((pods + per_node - 1) // per_node):
            mine = records[n * per_node:(n + 1) * per_node]
            usage = to_wire(NodeUsage(pods=[PodUsage.model_validate(r) for r in mine]))
            self.gpunodes.append({"metadata": {"name": f"node-{n}"},
                                  "status": {"usage": {**usage, "publishedTime": "2027-01-01T00:00:00Z"}}})
        self.stamp = 0
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes = 0

    def republish(self, share: float) -> None:
        """``share`` of the GPUNodes publish anew (a new ``publishedTime``; the histories as they were)."""
        self.stamp += 1
        step = max(1, round(1 / share))
        for node in self.gpunodes[self.stamp % step::step]:
            minute, second = self.stamp // 60 % 60, self.stamp % 60
            node["status"]["usage"]["publishedTime"] = f"2027-01-01T00:{minute:02d}:{second:02d}Z"

    # the controller.kube.Kube calls the recommender makes
    def list_gpunodes(self) -> list[dict[str, Any]]:
        return self.gpunodes

    def list_pods(self) -> list[dict[str, Any]]:
        return self.pods

    def list_policies(self) -> list[dict[str, Any]]:
        return []

    def list_namespaces(self) -> list[dict[str, Any]]:
        return [{"metadata": {"name": "ns", "labels": {}}}]

    def list_recommendations(self) -> list[dict[str, Any]]:
        return list(self.objects.values())

    def create_recommendation(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self.objects[(namespace, body["metadata"]["name"])] = body
        self.writes += 1
        return body

    def patch_recommendation_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self.objects[(namespace, name)]["status"] = status
        self.writes += 1
        return self.objects[(namespace, name)]


def measure(pods: int, replicas: int, per_node: int, cycles: int) -> dict[str, Any]:
    cluster = Cluster(pods, replicas, per_node)
    clock = [T0 + DAY_MINUTES * 60.0]
    settings = ControllerSettings(metrics_port=0)
    cycle = RecommenderCycle(cluster, settings, clock=lambda: clock[0])  # type: ignore[arg-type]
    began_cpu, began_wall = time.process_time(), time.perf_counter()
    report = cycle.run()
    cold = {"cpu_s": time.process_time() - began_cpu, "wall_s": time.perf_counter() - began_wall,
            "writes": cluster.writes, "workloads": report.workloads, "recommended": report.recommended}
    steady: list[tuple[float, float, int]] = []
    for _ in range(cycles):
        clock[0] += INTERVAL_S
        cluster.republish(INTERVAL_S / PUBLISH_S)
        writes = cluster.writes
        began_cpu, began_wall = time.process_time(), time.perf_counter()
        cycle.run()
        steady.append((time.process_time() - began_cpu, time.perf_counter() - began_wall, cluster.writes - writes))
    cpu = statistics.mean(s[0] for s in steady)  # the mean: a refresh cycle counts as often as it comes
    return {
        "pods": pods, "replicas": replicas, "pods_per_node": per_node, "gpunodes": len(cluster.gpunodes),
        "interval_s": INTERVAL_S, "publish_s": PUBLISH_S, "cold": cold,
        "steady": {"cpu_s_mean": cpu, "cpu_s_median": statistics.median(s[0] for s in steady),
                   "wall_s_median": statistics.median(s[1] for s in steady),
                   "cpu_s_max": max(s[0] for s in steady), "writes_max": max(s[2] for s in steady),
                   "cycles": cycles},
        "cores": cpu / INTERVAL_S,
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count(),
                    "processor": platform.processor() or platform.machine()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--replicas", type=int, default=5, help="pods per Deployment (default 5)")
    parser.add_argument("--pods-per-node", type=int, default=8, help="pods per GPUNode (default 8)")
    parser.add_argument("--cycles", type=int, default=12,
                        help="steady cycles measured (default 12: one of them rewrites every recommendation's "
                             "observed time, recommendation_refresh_seconds)")
    parser.add_argument("--no-write", action="store_true", help="print only; do not write recommender_cost.json")
    args = parser.parse_args()
    result = measure(args.pods, args.replicas, args.pods_per_node, args.cycles)
    text = json.dumps(result, indent=2, sort_keys=True)
    print(text)
    if not args.no_write:
        (ROOT / "benchmarks" / "recommender_cost.json").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
