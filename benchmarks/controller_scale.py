"""The controller's cost curve: one cycle at 100, 300, 1,250 and 2,500 nodes of 8 GPUs.

Each size runs in its own process (so peak RSS is that size's), against an
in-memory stand-in for the watch caches: the raw objects the controller's
informers would hold (GPUNodes with their agents' status, Nodes with labels and
allocatable, a SharingPolicy, the cluster's pods), and writes that change those
objects as the API server would (a new ``resourceVersion``; JSON and merge
patches applied). What is timed is ``controller.reconcile.Controller.cycle``
whole: snapshot, idle records, policy status, planning, releases (pin and
ungate), metrics (before the replica loop and right-sizing were removed it also
timed those; benchmarks/controller.md).

The cluster: 8 H100 GPUs per node; nine nodes in ten run MIG in one of four
layouts, one in ten shares its GPUs by MPS x4; about 40 % of the MIG instances
and half the replicas are held by bound pods (~15 pods per node).

Figures per size: CPU seconds of the controller's process per cycle (``time.process_time``,
every thread), the best of ``--repeats`` cycles. CPU time, not wall time, because the VM is
shared: other processes' load stretches wall time; it is also what "cores used" adds up.
The JSON has the median CPU and wall seconds too.

* ``cold``: the first cycle of a new controller (every object read; the cache's
  first list is not included: the API server's work, not the controller's);
* ``unchanged``: a cycle in which nothing changed (what ``--resync-seconds`` costs);
* ``k=10``, ``k=100``: a cycle after k gated pods arrived and k GPUNodes were
  rewritten by their agents (heartbeat and utilisation);
* ``rss_mib``: the process's peak resident memory (objects, caches, snapshot).

And, for comparison with the figures before the caches and indices, the pure
planning cycle of ``controller_throughput.py --mode plan`` (a burst of gated pods
planned at once, snapshot given).

    python benchmarks/controller_scale.py                   # all sizes; writes controller_scale.{json,md,png}
    python benchmarks/controller_scale.py --nodes 300 --no-write
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controller.reconcile import Controller  # noqa: E402
from controller.settings import ControllerSettings  # noqa: E402
from kube.times import format_time  # noqa: E402
from mig.catalog import get_model  # noqa: E402
from mig.geometry import fits  # noqa: E402
from sharing.api.allocation import Allocation, ContainerAllocation  # noqa: E402
from sharing.api.keys import ALLOCATION_ANNOTATION  # noqa: E402

H100 = get_model("H100-80GB")
LAYOUTS = (("1g.10gb",) * 7, ("2g.20gb", "2g.20gb", "3g.40gb"), ("3g.40gb", "4g.40gb"), ("1g.10gb",) * 3 + ("4g.40gb",))
PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb")
SIZES = (100, 300, 1250, 2500)
KS = (10, 100)
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


# ------------------------------------------------------------------ objects
def _allocation(mode: str, profile: str | None, gated: bool) -> str:
    resource_name = f"nvidia.com/mig-{profile}" if profile else "nvidia.com/gpu.shared"
    return Allocation(mode=mode, gated=gated, capacity_existed=not gated, policy="bench", reason="bench",  # type: ignore[arg-type]
                      containers=(ContainerAllocation("c", "containers", 100 if profile else 200, None,
                                                      resource_name, profile),)).to_annotation()


def pod_object(name: str, mode: str, profile: str | None, *, node: str | None, created: datetime, version: int) -> dict[str, Any]:
    gated = node is None
    resource_name = f"nvidia.com/mig-{profile}" if profile else "nvidia.com/gpu.shared"
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x", "resources": {
        "requests": {"cpu": "1", "memory": "4Gi"}, "limits": {resource_name: "1"}}}]}
    if gated:
        spec["schedulingGates"] = [{"name": "gpupack.io/capacity"}]
    else:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}", "resourceVersion": str(version),
                         "creationTimestamp": format_time(created),
                         "annotations": {ALLOCATION_ANNOTATION: _allocation(mode, profile, gated)}},
            "spec": spec, "status": {"phase": "Running" if node else "Pending"}}


def cluster(nodes: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(gpunodes, nodes, pods, policies) of the benchmark's cluster."""
    gpunodes, node_objs, pods = [], [], []
    beat = format_time(NOW - timedelta(seconds=20))
    version = 1
    for n in range(nodes):
        name = f"node-{n:04d}"
        shared = n % 10 == 9
        gpus = []
        for g in range(8):
            layout = () if shared else fits(H100, LAYOUTS[(n * 8 + g) % len(LAYOUTS)]) or ()
            instances = []
            for i, inst in enumerate(layout):
                held = (n + g + i) % 5 < 2  # ~40 % held by a bound pod
                instances.append({"profile": inst.profile, "start": inst.placement.start, "size": inst.placement.size,
                                  "inUse": held})
                if held:
                    pods.append(pod_object(f"run-{n}-{g}-{i}", "mig", inst.profile, node=name,
                                           created=NOW - timedelta(hours=1), version=version))
                    version += 1
            gpus.append({"index": g, "uuid": f"GPU-{n}-{g}", "product": H100.product, "memoryMiB": H100.memory_mib,
                         "migEnabled": not shared, "instances": instances, "utilization": {"gpuPercent": 30}})
        if shared:
            for r in range(16):  # half of 8 GPUs x 4 replicas
                pods.append(pod_object(f"run-{n}-s{r}", "mps", None, node=name, created=NOW - timedelta(hours=1),
                                       version=version))
                version += 1
        sharing = {"mode": "mps", "replicas": 4} if shared else {"mode": "none", "replicas": 1}
        gpunodes.append({"apiVersion": "gpupack.io/v1alpha1", "kind": "GPUNode",
                         "metadata": {"name": name, "generation": 1, "resourceVersion": str(version)},
                         "spec": {"sharing": sharing},
                         "status": {"observedGeneration": 1, "product": H100.product, "heartbeatTime": beat,
                                    "sharing": sharing, "gpus": gpus}})
        version += 1
        labels = {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": H100.product, "pool": "bench"}
        if shared:
            labels.update({"nvidia.com/gpu.sharing-strategy": "mps", "nvidia.com/gpu.replicas": "4"})
        node_objs.append({"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": str(version), "labels": labels},
                          "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "250"}}})
        version += 1
    policy = {"apiVersion": "gpupack.io/v1alpha1", "kind": "SharingPolicy",
              "metadata": {"name": "bench", "generation": 1, "resourceVersion": str(version)},
              "spec": {"nodeSelector": {"matchLabels": {"pool": "bench"}}, "reshaping": {"maxConcurrent": 16, "idleSeconds": 60}}}
    return gpunodes, node_objs, pods, [policy]


# -------------------------------------------------------- the caches' stand-in
def _apply_json_patch(obj: dict[str, Any], ops: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in str(op["path"]).split("/")[1:]]
        parent: Any = out
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        if op["op"] == "test":
            current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if current != op["value"]:
                raise ValueError(f"test failed at {op['path']}")
        elif op["op"] in ("add", "replace"):
            if isinstance(parent, list):
                parent.append(op["value"]) if last == "-" else parent.insert(int(last), op["value"])
            else:
                parent[last] = op["value"]
        elif op["op"] == "remove":
            del parent[last]
    return out


def _merge(target: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class MemoryKube:
    """What ``controller.watch_caches.CachedKube`` gives the controller once its caches have listed:
    lists of shared objects; writes that replace an object by a new version."""

    def __init__(self, gpunodes: list[dict[str, Any]], nodes: list[dict[str, Any]], pods: list[dict[str, Any]],
                 policies: list[dict[str, Any]]) -> None:
        self.gpunodes = {g["metadata"]["name"]: g for g in gpunodes}
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.pods = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods}
        self.policies = {p["metadata"]["name"]: p for p in policies}
        self.version = 10**7
        self.writes = 0

    def _next(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.writes += 1
        obj["metadata"] = {**obj["metadata"], "resourceVersion": str(self.version)}
        return obj

    def list_gpunodes(self) -> list[dict[str, Any]]:
        return list(self.gpunodes.values())

    def list_nodes(self) -> list[dict[str, Any]]:
        return list(self.nodes.values())

    def list_pods(self) -> list[dict[str, Any]]:
        return list(self.pods.values())

    def list_policies(self) -> list[dict[str, Any]]:
        return list(self.policies.values())

    def list_namespaces(self) -> list[dict[str, Any]]:
        return []

    def list_resource_claims(self) -> list[dict[str, Any]]:
        return []

    def patch_gpunode(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        obj = self._next(_merge(self.gpunodes[name], body))
        self.gpunodes[name] = obj
        return obj

    def patch_policy_status(self, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        obj = self._next(_merge(self.policies[name], {"status": status}))
        self.policies[name] = obj
        return obj

    def json_patch_pod(self, namespace: str, name: str, ops: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        key = f"{namespace}/{name}"
        obj = self._next(_apply_json_patch(self.pods[key], ops))
        self.pods[key] = obj
        return obj

    def merge_patch_pod(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        key = f"{namespace}/{name}"
        obj = self._next(_merge(self.pods[key], body))
        self.pods[key] = obj
        return obj

    def event(self, *_: Any) -> None:
        pass

    def get_configmap(self, *_: Any) -> None:
        return None

    def heartbeat(self, names: Sequence[str], at: datetime, percent: int) -> None:
        """The agents of ``names`` report: a new heartbeat time and utilisation."""
        for name in names:
            obj = copy.deepcopy(self.gpunodes[name])
            obj["status"]["heartbeatTime"] = format_time(at)
            for gpu in obj["status"]["gpus"]:
                gpu["utilization"] = {"gpuPercent": percent}
            self.gpunodes[name] = self._next(obj)

    def arrive(self, count: int, at: datetime, tag: str) -> None:
        """``count`` gated pods (MIG of the four profiles, one in five MPS) are admitted."""
        for i in range(count):
            profile = None if i % 5 == 4 else PROFILES[i % 4]
            name = f"new-{tag}-{i}"
            self.pods[f"bench/{name}"] = self._next(
                pod_object(name, "mps" if profile is None else "mig", profile, node=None, created=at, version=0))


# ------------------------------------------------------------------ measuring
def one_size(nodes: int, repeats: int) -> dict[str, Any]:
    kube = MemoryKube(*cluster(nodes))
    now = [NOW]
    settings = ControllerSettings(metrics_port=0)
    pods_at_start = len(kube.pods)

    walls: dict[str, list[float]] = {}

    def timed(controller: Controller, what: str = "") -> tuple[float, Any]:
        began, cpu = time.perf_counter(), time.process_time()
        report = controller.cycle()
        walls.setdefault(what, []).append(time.perf_counter() - began)
        return time.process_time() - cpu, report

    def fresh() -> Controller:
        return Controller(kube, settings, clock=lambda: now[0])  # type: ignore[arg-type]

    cold = []
    for _ in range(repeats):
        seconds, report = timed(fresh(), "cold")
        cold.append(seconds)
    controller = fresh()
    timed(controller)  # its own cold cycle
    timed(controller)  # the echo of its writes (idle records)
    unchanged = []
    for _ in range(repeats):
        seconds, report = timed(controller, "unchanged")
        unchanged.append(seconds)
        assert not report.errors, report.errors
    out: dict[str, Any] = {"nodes": nodes, "gpus": nodes * 8, "pods": pods_at_start,
                           "cold_s": min(cold), "unchanged_s": min(unchanged),
                           "cold_median_s": statistics.median(cold), "unchanged_median_s": statistics.median(unchanged)}
    names = sorted(kube.gpunodes)
    for k in KS:
        times, released, reread = [], 0, 0
        for r in range(repeats):
            now[0] += timedelta(seconds=2)
            kube.arrive(k, now[0] - timedelta(seconds=1), f"{k}-{r}")
            kube.heartbeat(names[(r * k) % len(names):][:k], now[0], 30 + r)
            seconds, report = timed(controller, f"k{k}")
            times.append(seconds)
            released += len(report.released)
            reread = controller.snapshots.parsed_nodes + controller.snapshots.parsed_pods
            timed(controller)  # the echo of its writes, as the watch would bring it
        out[f"k{k}_s"] = min(times)
        out[f"k{k}_median_s"] = statistics.median(times)
        out[f"k{k}_released"] = released
        out[f"k{k}_reread_objects"] = reread
    for what, values in walls.items():
        if what:
            out[f"{what}_wall_median_s"] = statistics.median(values)
    out["pods_at_end"] = len(kube.pods)
    out["rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return out


def pure_plan(nodes: int, pods: int) -> float:
    """``controller_throughput.py --mode plan``'s figure (median of 3)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("throughput", ROOT / "benchmarks" / "controller_throughput.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return float(module.pure(nodes, pods, 3)["cycle_seconds_best"])


def child(args: list[str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True, text=True)
    return dict(json.loads(done.stdout))


# ------------------------------------------------------------------ reporting
OLD_PLAN = {(200, 1000): 0.85, (1250, 2000): 5.8}
"""Pure planning cycle before the caches and indices (issue 16's figures, the project's 2-core VM)."""


def write(results: list[dict[str, Any]], plans: dict[str, float], command: str) -> None:
    out = ROOT / "benchmarks"
    (out / "controller_scale.json").write_text(json.dumps({"command": command, "sizes": results, "plan": plans}, indent=2) + "\n")
    rows = [f"| {r['nodes']:,} | {r['gpus']:,} | {r['pods']:,} | {r['cold_s']:.3f} | {r['unchanged_s']:.3f} | "
            f"{r['k10_s']:.3f} | {r['k100_s']:.3f} | {r['rss_mib']:.0f} |" for r in results]
    plan_rows = []
    for key, value in plans.items():
        nodes, pods = (int(x) for x in key.split("x"))
        before = OLD_PLAN[nodes, pods]
        plan_rows.append(f"| {nodes:,} x {pods:,} | {before:.2f} | {value:.3f} | {before / value:.1f}x |")
    (out / "controller_scale.md").write_text("\n".join([
        "# Controller cost curve",
        "",
        f"`{command}` (about three minutes). Machine: the project's 2-core VM, shared with other work while",
        "measuring; Python 3.11. One process per size; seconds are CPU seconds of the controller's process,",
        "the best of 5 cycles (medians, and wall seconds, in `controller_scale.json`). What each column",
        "measures: the docstring of `benchmarks/controller_scale.py`.",
        "",
        "| nodes | GPUs | pods | cold cycle s | nothing changed s | 10 waiting + 10 changed s | 100 + 100 s | peak RSS MiB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        "Pure planning cycle (`controller_throughput.py --mode plan`, nodes x gated pods, best of 3 wall seconds;",
        "before: issue 16's figures, same VM):",
        "",
        "| nodes x pods | before s | now s | ratio |",
        "| --- | --- | --- | --- |",
        *plan_rows,
        "",
        "![cost curve](controller_scale.png)",
        "",
    ]))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    xs = [r["nodes"] for r in results]
    for key, label in (("cold_s", "cold (every object read)"), ("k100_s", "100 pods waiting, 100 nodes changed"),
                       ("k10_s", "10 waiting, 10 changed"), ("unchanged_s", "nothing changed")):
        left.plot(xs, [r[key] for r in results], marker="o", label=label)
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("nodes (8 GPUs each)")
    left.set_ylabel("CPU seconds per cycle")
    left.set_title("controller cycle")
    left.legend(fontsize=8)
    left.grid(True, which="both", alpha=0.3)
    right.plot(xs, [r["rss_mib"] for r in results], marker="o", color="tab:purple")
    right.set_ylim(bottom=0)
    right.set_xlabel("nodes (8 GPUs each)")
    right.set_ylabel("peak RSS MiB")
    right.set_title("controller memory (objects held + snapshot)")
    right.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "controller_scale.png", dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="*", default=list(SIZES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--plan", nargs=2, type=int, metavar=("NODES", "PODS"), help=argparse.SUPPRESS)
    parser.add_argument("--no-write", action="store_true", help="print the figures; write no files")
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one_size(args.nodes[0], args.repeats)))
        return 0
    if args.plan:
        print(json.dumps({"seconds": pure_plan(*args.plan)}))
        return 0
    results = []
    for n in args.nodes:
        results.append(child(["--one", "--nodes", str(n), "--repeats", str(args.repeats)]))
        print(json.dumps(results[-1]), file=sys.stderr)
    plans = {}
    if not args.no_write:
        for nodes, pods in OLD_PLAN:
            plans[f"{nodes}x{pods}"] = child(["--plan", str(nodes), str(pods)])["seconds"]
    print(json.dumps({"sizes": results, "plan": plans}, indent=2))
    if not args.no_write:
        write(results, plans, "python benchmarks/controller_scale.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
