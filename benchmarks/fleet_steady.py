"""Steady state on a KWOK fleet (issue 16, "Numbers"): gpupack live, fractional pods arriving and finishing.

    python benchmarks/fleet_steady.py --json benchmarks/fleet_steady.json            # 1,250 nodes, 20/s, 10 min
    python benchmarks/fleet_steady.py --floor --json benchmarks/fleet_steady.json    # the same, no gpupack
    python benchmarks/fleet_steady.py --nodes 100 --minutes 2 --warmup-minutes 1     # a smoke run

**What runs (gpupack).** The local control plane with KWOK (``gpupack.devcluster``:
etcd, kube-apiserver, kube-scheduler with the shipped configuration, kwok),
gpupack's manifests, ``--nodes`` KWOK Nodes with 8 simulated H100-80GB each
(``gpupack.io/simulated-gpus=H100-80GB:8``), half of them MIG nodes (GPUs with MIG
on, no instance: the controller creates instances as pods ask) and half MPS nodes
(GPUs with MIG off, ``sharing.mode: none`` until the controller switches a node to
MPS for a pod). Which is which is the GPUs' MIG mode (the simulated NVML state
file written before the fleet starts, as a real node is set up) and a node label
``fleet-steady.gpupack.io/pool=mig|mps`` that two SharingPolicies select
(no idle time before a change, every node may change at once). One ``gpupack
agent fleet`` process serves every node, ``gpupack webhook serve`` is registered
over TLS as the mutating/validating webhook, ``gpupack controller run`` plans
(its default 10 s resync and 0.5 s batching). The pieces are the demo's ``Stack``'s
public steps, as ``gpupack.replay.stack`` uses them (its webhook probe asking for an MPS share: ``probe_sharing="mps"``).

**What runs (``--floor``).** The same control plane and KWOK fleet, the Nodes
advertising ``nvidia.com/gpu: 8`` themselves, no gpupack component: plain pods
asking one whole GPU, bound by kube-scheduler. What this 2-core machine spends
on the control plane alone at the same rate.

**Load.** Pods created open-loop at ``--rate`` per second (pod *i* is due at
``i / rate`` s; 16 threads create them, so a slow create does not hold back the
next), for ``--minutes``. The mix (seeded): half MIG-shaped (``gpupack.io/sharing:
mig``, ``gpupack.io/gpu-milli`` 140/280/420, which the webhook turns into
1g.10gb/2g.20gb/3g.40gb on an H100, weights 5:3:2), half MPS shares (``mps``, 250
or 500 milli, 6:4; ``--mig-fraction`` changes the MIG half); the floor's pods ask
``nvidia.com/gpu: 1``. Each pod
carries ``gpupack.io/duration-seconds`` drawn uniformly from 30..90 s: KWOK ends
it Succeeded then, freeing its capacity. Uniform and bounded, so the number of
running pods is stationary (rate x 60 s mean = 1,200 at 20/s, about 12 % of the
10,000 GPUs: capacity never binds, what is measured is the machinery's cost)
from the 90th second after the first bind on: the default 2-minute warm-up is
past that. Finished pods are **not** deleted: there is no pod GC in the dev
cluster, and kube-controller-manager's would not act below 12,500 terminated
pods (a 10-minute run at 20/s makes 12,000); every gpupack component and
kube-scheduler skip Succeeded pods. They are counted (``completed``).

**Measured over the steady window** (from ``--warmup-minutes`` to the end of the
load): each process's CPU seconds / wall seconds and peak RSS (``/proc``, via
``gpupack.replay.costs``; VmHWM is the peak over the process's whole life,
start-up included); pod creation to bound latency of the pods created in the
window (client side: just before the create call to when the benchmark's watch
saw ``spec.nodeName``; pods not bound 60 s after the load ends are counted as
unbound); the API server's ``apiserver_request_total`` delta by verb and
resource; the agents' own API writes (``gpupack_fleet_api_requests_total{by="agents"}``,
the fleet's Prometheus endpoint) per node per minute. Progress on stderr every
15 s. Ctrl-C stops everything.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import re
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MODEL: Final = "H100-80GB"
GPUS_PER_NODE: Final = 8
POOL_LABEL: Final = "fleet-steady.gpupack.io/pool"
RUN_LABEL: Final = "fleet-steady.gpupack.io/run"
NAMESPACE: Final = "gpupack-demo"
"""The demo's namespace: ``Stack`` creates it with its ServiceAccount and probes the webhook in it."""
DURATION_RANGE: Final = (30, 90)
MIG_MIX: Final = ((140, 5), (280, 3), (420, 2))
"""(gpu-milli, weight): 1g.10gb, 2g.20gb, 3g.40gb on an H100 (k/7 of its compute covers milli/1000)."""
MPS_MIX: Final = ((250, 6), (500, 4))
CREATE_THREADS: Final = 16
UNBOUND_GRACE_S: Final = 60.0
WRITE_VERBS: Final = frozenset({"create", "update", "patch", "delete", "deletecollection", "apply", "post", "put"})
"""Write verbs: the fleet counts the client's (lower case), the API server its HTTP verbs (POST, PUT, ...)."""


# ------------------------------------------------------------------ pure parts


@dataclass(frozen=True)
class PodAsk:
    """What one pod of the load asks."""

    index: int
    kind: str
    """``mig``, ``mps`` or ``whole`` (the floor)."""
    milli: int
    duration_s: int


def load_plan(count: int, seed: int, floor: bool, mig_fraction: float = 0.5) -> list[PodAsk]:
    """The seeded pods of a run (module docstring): ``mig_fraction`` of them MIG, the rest MPS, or whole
    GPUs for the floor."""
    rng = random.Random(seed)
    out: list[PodAsk] = []
    for i in range(count):
        duration = rng.randint(*DURATION_RANGE)
        if floor:
            out.append(PodAsk(i, "whole", 1000, duration))
            continue
        kind = "mig" if rng.random() < mig_fraction else "mps"
        mix = MIG_MIX if kind == "mig" else MPS_MIX
        milli = rng.choices([m for m, _ in mix], weights=[w for _, w in mix])[0]
        out.append(PodAsk(i, kind, milli, duration))
    return out


def pod_manifest(ask: PodAsk, run_id: str) -> dict[str, Any]:
    from sharing.api.keys import DURATION_ANNOTATION, MILLI_RESOURCE, SHARING_ANNOTATION, WHOLE_RESOURCE

    annotations = {DURATION_ANNOTATION: str(ask.duration_s)}
    if ask.kind == "whole":
        limits = {WHOLE_RESOURCE: "1"}
    else:
        limits = {MILLI_RESOURCE: str(ask.milli)}
        annotations[SHARING_ANNOTATION] = ask.kind
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"p{ask.index:06d}", "namespace": NAMESPACE, "labels": {RUN_LABEL: run_id},
                     "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/steady:never-pulled", "resources": {
            "requests": {"cpu": "500m", "memory": "1Gi"}, "limits": limits}}],
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 0},
    }


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) by the nearest-rank rule; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def counter_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The labelled samples of the Prometheus counter ``name`` in an exposition text."""
    return [(dict(_LABEL.findall(m.group("labels"))), float(m.group("value")))
            for m in _SAMPLE.finditer(text) if m.group("name") == name]


def apiserver_by_verb_resource(text: str) -> dict[str, float]:
    """``apiserver_request_total`` summed by ``VERB resource[/subresource]``."""
    out: dict[str, float] = {}
    for labels, value in counter_samples(text, "apiserver_request_total"):
        resource = labels.get("resource", "") + (f"/{labels['subresource']}" if labels.get("subresource") else "")
        key = f"{labels.get('verb', '')} {resource}"
        out[key] = out.get(key, 0.0) + value
    return out


def fleet_requests(text: str) -> dict[str, float]:
    """``gpupack_fleet_api_requests_total`` summed by ``BY VERB resource``."""
    out: dict[str, float] = {}
    for labels, value in counter_samples(text, "gpupack_fleet_api_requests_total"):
        key = f"{labels.get('by', '')} {labels.get('verb', '')} {labels.get('resource', '')}"
        out[key] = out.get(key, 0.0) + value
    return out


def counter_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, int]:
    out = {k: int(round(v - before.get(k, 0.0))) for k, v in after.items()}
    return {k: v for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v > 0}


def writes(counts: Mapping[str, int], verb_at: int = 0) -> int:
    """The write requests of a ``VERB ...``-keyed count (``verb_at``: which word is the verb)."""
    return sum(n for key, n in counts.items() if key.split(" ")[verb_at].lower() in WRITE_VERBS)


# ------------------------------------------------------------------ the live run


@dataclass
class Tracker:
    """Per pod: when its create was called, when the watch saw it bound, whether it finished."""

    created: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    succeeded: set[str] = field(default_factory=set)
    refused: dict[str, str] = field(default_factory=dict)
    late_s: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def watched(self, event: str, pod: Mapping[str, Any]) -> None:
        name = str((pod.get("metadata") or {}).get("name", ""))
        now = time.monotonic()
        with self.lock:
            if (pod.get("spec") or {}).get("nodeName") and name not in self.bound:
                self.bound[name] = now
            if (pod.get("status") or {}).get("phase") == "Succeeded":
                self.succeeded.add(name)

    def counts(self) -> dict[str, int]:
        with self.lock:
            return {"created": len(self.created), "bound": len(self.bound), "pending": len(self.created) - len(
                [n for n in self.created if n in self.bound]), "completed": len(self.succeeded), "refused": len(self.refused)}


def _metrics_text(admin: Any) -> str:
    method, url, headers, _, _ = admin.param_serialize("GET", "/metrics", header_params={"Accept": "text/plain"})
    response = admin.call_api(method, url, header_params=headers)
    response.read()
    return str(response.data.decode("utf-8"))


def _http_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())


def _say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


class Bench:
    """Start with :meth:`start`, load with :meth:`load`, always :meth:`stop`."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.plane: Any = None
        self.stack: Any = None
        self.admin: Any = None
        self.fleet_port = 0
        self.setup_s = 0.0
        self.published_after_s = 0.0

    # ---------------------------------------------------------------- start
    def start(self) -> None:
        began = time.monotonic()
        if self.args.floor:
            self._start_floor()
        else:
            self._start_gpupack()
        self.setup_s = time.monotonic() - began

    def _node_names(self) -> tuple[list[str], list[str]]:
        from gpupack.devcluster.kwok import node_names

        half = self.args.nodes // 2
        return node_names(half, "mig-"), node_names(self.args.nodes - half, "mps-", half)

    def _start_floor(self) -> None:
        from kubernetes import client

        from gpupack.devcluster import kwok
        from gpupack.devcluster.binaries import ensure_binaries
        from gpupack.devcluster.controlplane import ControlPlane, ControlPlaneConfig

        binaries = ensure_binaries(progress=sys.stderr, kwok=True)
        self.plane = ControlPlane(binaries, ControlPlaneConfig(workdir=self.workdir / "cluster", kwok=True))
        self.plane.start()
        _say(f"control plane: up in {self.plane.startup_seconds or 0:.1f}s")
        self.admin = self.plane.admin_client()
        core = client.CoreV1Api(self.admin)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
        core.create_namespaced_service_account(NAMESPACE, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="default")))
        names = kwok.create_nodes(self.admin, self.args.nodes, prefix="gpu-", cpu=128, memory="2Ti", pods=110,
                                  extended={"nvidia.com/gpu": GPUS_PER_NODE})
        kwok.wait_ready(self.admin, names, timeout_s=60 + 0.5 * len(names))
        _say(f"nodes: {len(names)} KWOK nodes Ready, advertising nvidia.com/gpu: {GPUS_PER_NODE}")

    def _start_gpupack(self) -> None:
        from kubernetes import client

        from gpupack.demo.stack import GROUP, VERSION, Stack
        from gpupack.devcluster import kwok
        from gpupack.devcluster.apply import apply_objects, gpupack_manifests
        from gpupack.devcluster.binaries import ensure_binaries
        from gpupack.devcluster.controlplane import ControlPlane, ControlPlaneConfig
        from gpupack.devcluster.process import free_port
        from gpupack.replay.mapping import REPLAY_LABEL
        from node.nvml.simulated import simulated_backend
        from sharing.api.keys import BACKEND_LABEL, DEPLOY_DEVICE_PLUGIN_LABEL

        # As the replay's: its webhook probe asks for an MPS share, which needs no shared node yet.
        self.stack = Stack(self.workdir, nodes=(), probe_sharing="mps")
        binaries = ensure_binaries(progress=sys.stderr, kwok=True)
        self.plane = ControlPlane(binaries, ControlPlaneConfig(workdir=self.workdir / "cluster", kwok=True))
        self.stack.plane = self.plane
        self.plane.start()
        _say(f"control plane: up in {self.plane.startup_seconds or 0:.1f}s")
        self.admin = self.stack.admin = self.plane.admin_client()
        apply_objects(self.admin, gpupack_manifests(), field_manager="fleet-steady")
        self.stack.create_namespace()
        custom = client.CustomObjectsApi(self.admin)
        for pool in ("mig", "mps"):
            custom.create_cluster_custom_object(GROUP, VERSION, "sharingpolicies", {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "SharingPolicy", "metadata": {"name": f"steady-{pool}"},
                "spec": {"nodeSelector": {"matchLabels": {POOL_LABEL: pool}},
                         "reshaping": {"maxConcurrent": max(1, self.args.nodes), "idleSeconds": 0},
                         "replicas": {"min": 1, "max": 8}}})
        mig_nodes, mps_nodes = self._node_names()
        state = self.workdir / "nvml"
        state.mkdir(parents=True, exist_ok=True)
        for name in mps_nodes:  # MIG off, as a node meant for MPS is set up (changing it needs a GPU reset)
            simulated_backend(MODEL, GPUS_PER_NODE, state / f"{name}.json", seed=name, mig_enabled=False)
        common = {"cpu": 128, "memory": "2Ti", "pods": 110, "annotations": kwok.simulated_gpus(MODEL, GPUS_PER_NODE)}
        base = {REPLAY_LABEL: "on", BACKEND_LABEL: "device-plugin", DEPLOY_DEVICE_PLUGIN_LABEL: "true"}
        for pool, names, start in (("mig", mig_nodes, 0), ("mps", mps_nodes, len(mig_nodes))):
            if names:
                kwok.create_nodes(self.admin, len(names), prefix=f"{pool}-", start=start,
                                  labels={**base, POOL_LABEL: pool}, **common)
        kwok.wait_ready(self.admin, mig_nodes + mps_nodes, timeout_s=60 + 0.5 * self.args.nodes)
        _say(f"nodes: {len(mig_nodes)} MIG + {len(mps_nodes)} MPS KWOK nodes Ready ({self.args.nodes * GPUS_PER_NODE} GPUs)")
        # The admin's kubeconfig, as docs/agent-fleet.md says: the fleet watches bound pods cluster-wide, which
        # the node agent's ServiceAccount may not (its watch is refused with 403).
        kubeconfig = str(self.plane.kubeconfig)
        self.fleet_port = free_port()
        fleet_began = time.monotonic()
        self.stack.start_process("fleet", ["agent", "fleet", "--kubeconfig", kubeconfig, "--selector", f"{REPLAY_LABEL}=on",
                                           "--state-dir", str(state), "--metrics-port", str(self.fleet_port)])
        self.stack.start_webhook()
        _say("webhook: serving over TLS, registered with the API server")
        self.stack.start_controller("controller", "--metrics-port", str(free_port()),
                                    "--resync-seconds", "10", "--batch-seconds", "0.5")
        _say("controller: running")
        self._wait_published(set(mig_nodes + mps_nodes))
        self.published_after_s = time.monotonic() - fleet_began

    def _wait_published(self, names: set[str]) -> None:
        """Every GPUNode reports its 8 GPUs and every Node carries the product label."""
        from kubernetes import client

        from gpupack.demo.stack import GROUP, VERSION
        from sharing.api.keys import PRODUCT_LABEL

        deadline = time.monotonic() + 120 + 0.5 * len(names)
        while True:
            listed: Any = client.CustomObjectsApi(self.admin).list_cluster_custom_object(GROUP, VERSION, "gpunodes")
            reported = {g["metadata"]["name"] for g in listed.get("items", [])
                        if len((g.get("status") or {}).get("gpus") or []) == GPUS_PER_NODE}
            nodes = [self.admin.sanitize_for_serialization(n) for n in client.CoreV1Api(self.admin).list_node().items]
            labelled = {n["metadata"]["name"] for n in nodes if PRODUCT_LABEL in (n["metadata"].get("labels") or {})}
            missing = names - (reported & labelled)
            if not missing:
                _say(f"agents: all {len(names)} GPUNodes published and Nodes labelled")
                return
            for proc in self.stack.processes:
                if not proc.running():
                    raise RuntimeError(f"{proc.name} exited; log: {proc.log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(missing)} node(s) not published in time, e.g. {sorted(missing)[:3]}")
            time.sleep(2.0)

    def processes(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for proc in (self.stack.processes if self.stack is not None else []) + (self.plane.processes if self.plane else []):
            if proc.pid is not None:
                out.setdefault(proc.name, []).append(proc.pid)
        return out

    def stop(self) -> None:
        if self.stack is not None:
            self.stack.stop()  # its processes, then the control plane
        elif self.plane is not None:
            if self.admin is not None:
                self.admin.close()
            self.plane.stop()

    # ---------------------------------------------------------------- load
    def load(self) -> dict[str, Any]:
        from kubernetes import client

        from gpupack.replay.costs import component_cost, sample_all
        from kube.informer import Informer

        args = self.args
        run_id = f"r{int(time.time())}"
        plan = load_plan(int(args.rate * args.minutes * 60), args.seed, args.floor, args.mig_fraction)
        tracker = Tracker()
        pods = Informer("pods", partial(client.CoreV1Api(self.admin).list_namespaced_pod, NAMESPACE,
                                        label_selector=f"{RUN_LABEL}={run_id}"))
        pods.listeners.append(tracker.watched)
        pods.start()
        if not pods.wait_synced(60):
            raise RuntimeError("the benchmark's pod watch did not sync in 60 s")
        local = threading.local()

        def core() -> Any:
            if not hasattr(local, "core"):
                local.core = client.CoreV1Api(self.plane.admin_client())
            return local.core

        def create(ask: PodAsk, due: float) -> None:
            name = f"p{ask.index:06d}"
            began = time.monotonic()
            with tracker.lock:
                tracker.created[name] = began
                tracker.late_s.append(began - due)
            try:
                core().create_namespaced_pod(NAMESPACE, pod_manifest(ask, run_id))
            except client.ApiException as exc:
                with tracker.lock:
                    tracker.refused[name] = f"{exc.status} {str(exc.body)[:200]}"
                    del tracker.created[name]

        procs = self.processes()
        t0 = time.monotonic()
        warm_end = t0 + args.warmup_minutes * 60
        load_end = t0 + args.minutes * 60
        before: dict[str, Any] = {}
        loads: list[list[float]] = []
        stop_progress = threading.Event()

        def progress() -> None:
            start_cpu = sample_all([p for pids in procs.values() for p in pids])
            while not stop_progress.wait(15):
                now_cpu = sample_all([p for pids in procs.values() for p in pids])
                elapsed = time.monotonic() - t0
                cores = {name: component_cost({p: start_cpu.get(p) for p in pids}, {p: now_cpu.get(p) for p in pids}).cpu_seconds / elapsed
                         for name, pids in procs.items()}
                loads.append(_loadavg())
                c = tracker.counts()
                _say(f"t={elapsed:5.0f}s created {c['created']} bound {c['bound']} pending {c['pending']} "
                     f"completed {c['completed']} refused {c['refused']} load {loads[-1][0]:.1f}; cores "
                     + " ".join(f"{k}={v:.2f}" for k, v in sorted(cores.items())))

        def mark_warm() -> None:
            before["cpu"] = sample_all([p for pids in procs.values() for p in pids])
            before["api"] = apiserver_by_verb_resource(_metrics_text(self.admin))
            before["fleet"] = fleet_requests(_http_text(self.fleet_port)) if self.fleet_port else {}
            before["t"] = time.monotonic()
            before["loadavg"] = _loadavg()
            _say("warm-up over: steady window starts")

        threading.Thread(target=progress, daemon=True).start()
        pool = ThreadPoolExecutor(CREATE_THREADS)
        try:
            for ask in plan:
                due = t0 + ask.index / args.rate
                if not before and due >= warm_end:
                    mark_warm()
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                pool.submit(create, ask, due)
            if not before:
                mark_warm()
            pool.shutdown(wait=True)  # creates still queued when the last is due finish inside the window
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            stop_progress.set()
            pods.stop()
            raise
        t_end = max(time.monotonic(), load_end)
        after_cpu = sample_all([p for pids in procs.values() for p in pids])
        after_api = apiserver_by_verb_resource(_metrics_text(self.admin))
        after_fleet = fleet_requests(_http_text(self.fleet_port)) if self.fleet_port else {}
        end_counts = tracker.counts()
        end_loadavg = _loadavg()
        window_s = t_end - before["t"]
        _say(f"load over: {end_counts}; waiting up to {UNBOUND_GRACE_S:.0f}s for the window's pods to bind")
        in_window = [n for n, t in tracker.created.items() if before["t"] <= t < t_end]
        grace_end = time.monotonic() + UNBOUND_GRACE_S
        while time.monotonic() < grace_end and any(n not in tracker.bound for n in in_window):
            time.sleep(1.0)
        stop_progress.set()
        pods.stop()

        latencies = [tracker.bound[n] - tracker.created[n] for n in in_window if n in tracker.bound]
        costs = {name: component_cost({p: before["cpu"].get(p) for p in pids}, {p: after_cpu.get(p) for p in pids})
                 for name, pids in procs.items()}
        api = counter_delta(before["api"], after_api)
        fleet = counter_delta(before["fleet"], after_fleet)
        agent_writes = sum(n for k, n in fleet.items() if k.startswith("agents ") and k.split(" ")[1] in WRITE_VERBS)
        minutes = window_s / 60
        return {
            "mode": "floor" if args.floor else "gpupack",
            "nodes": args.nodes, "gpus": args.nodes * GPUS_PER_NODE, "rate_per_s": args.rate, "minutes": args.minutes,
            "warmup_minutes": args.warmup_minutes, "seed": args.seed,
            "mig_fraction": None if args.floor else args.mig_fraction, "setup_s": round(self.setup_s, 1),
            "published_after_s": round(self.published_after_s, 1) if not args.floor else None,
            "window_s": round(window_s, 1),
            "pods": {**end_counts, "planned": len(plan), "in_window": len(in_window),
                     "in_window_unbound_after_grace": len(in_window) - len(latencies),
                     "refused_examples": list(tracker.refused.values())[:3]},
            "create_lateness_s": {"p50": _r(percentile(tracker.late_s, 0.5)), "p95": _r(percentile(tracker.late_s, 0.95)),
                                  "max": _r(max(tracker.late_s, default=0.0))},
            "bound_latency_s": {"p50": _r(percentile(latencies, 0.5)), "p95": _r(percentile(latencies, 0.95)),
                                "p99": _r(percentile(latencies, 0.99)), "max": _r(max(latencies, default=0.0)),
                                "count": len(latencies)},
            "components": {name: {"cores": round(c.cpu_seconds / window_s, 3), "cpu_seconds": round(c.cpu_seconds, 1),
                                  "peak_rss_mib": round(c.peak_rss_mib, 1)} for name, c in sorted(costs.items())},
            "apiserver_requests": api,
            "apiserver_requests_per_s": round(sum(api.values()) / window_s, 1),
            "apiserver_writes_per_s": round(writes(api) / window_s, 1),
            "fleet_requests": fleet,
            "agent_writes_per_node_per_minute": round(agent_writes / args.nodes / minutes, 2) if not args.floor else None,
            "loadavg": {"at_warm": before["loadavg"], "at_end": end_loadavg,
                        "mean_1min_during": round(sum(x[0] for x in loads) / len(loads), 2) if loads else None},
        }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--rate", type=float, default=20.0, help="pods created per second")
    parser.add_argument("--minutes", type=float, default=10.0, help="minutes of load, warm-up included")
    parser.add_argument("--warmup-minutes", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--mig-fraction", type=float, default=0.5,
                        help="share of the fractional pods that ask for MIG (the rest MPS); 0: MPS only")
    parser.add_argument("--floor", action="store_true", help="no gpupack: plain pods, nodes advertise nvidia.com/gpu")
    parser.add_argument("--json", help="add this run's result to FILE (keyed by mode and size)")
    parser.add_argument("--workdir", default="", help="keep the control plane's data and every component's log here (made if missing; default: a temporary folder, removed)")
    args = parser.parse_args(argv)
    import signal
    import tempfile

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # SIGTERM stops everything as Ctrl-C does; SIGINT too where a shell started us with it ignored.
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    with contextlib.ExitStack() as scope:
        if args.workdir:
            workdir = Path(args.workdir)
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            workdir = Path(scope.enter_context(tempfile.TemporaryDirectory(prefix="fleet-steady-")))
        bench = Bench(args, workdir)
        try:
            bench.start()
            _say(f"setup: {bench.setup_s:.0f}s; load: {args.rate}/s for {args.minutes} min")
            result = bench.load()
        except KeyboardInterrupt:
            _say("interrupted: stopping everything")
            return 130
        finally:
            bench.stop()
    result["command"] = "python benchmarks/fleet_steady.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        path = Path(args.json)
        runs: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        mix = f"-mig{args.mig_fraction:g}" if not args.floor and args.mig_fraction != 0.5 else ""
        runs[f"{result['mode']}{mix}-{args.nodes}n-{args.rate:g}ps-{args.minutes:g}m"] = result
        path.write_text(json.dumps(runs, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

