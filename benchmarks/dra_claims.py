"""The DRA backend's throughput on the real control plane: claims allocated per second by kube-scheduler.

    python benchmarks/dra_claims.py --nodes 100 --out benchmarks/dra_claims.json
    python benchmarks/dra_claims.py --nodes 1000 --pods 1000 --variant shared --out benchmarks/dra_claims.json
    python benchmarks/dra_claims.py --nodes 1000 --pods 500 --variant mig --out benchmarks/dra_claims.json
    python benchmarks/dra_claims.py --nodes 3 --pods 6 --variant shared --json     # a smoke run

What runs: the local control plane (``gpupack.devcluster``: etcd, kube-apiserver,
kube-scheduler with the configuration ``manifests/scheduler`` ships, and
kube-controller-manager, whose resourceclaim controller turns each pod's
ResourceClaimTemplate into a ResourceClaim). No kubelet and no gpupack agent:
this script creates N Node objects (status Ready, 64 CPUs, 512 GiB, labelled
``gpupack.io/backend=dra``) and publishes each node's ResourceSlices exactly as
the agent's first publish would (``node.advertising.dra_offers.node_offer`` on a
SIMULATED NVML snapshot of 8 GPUs, ``sharing.dra.slices.node_slices``, the
validator, ``node.advertising.dra_pool.plan``), then applies
``manifests/dra/deviceclasses.yaml``.

Two variants (``--variant``):

* ``shared``: 8 H100 80GB per node, MIG off, shared by MPS: one device per GPU
  with consumable ``milli`` and ``memory``. Pod ``i`` asks a share of
  100, 200, 300, 400, 500 milli (in turn);
* ``mig``: 8 MIG-capable GPUs per node in dynamic mode (H100 80GB on even
  nodes, A100 80GB on odd ones), every placement of every profile published as
  a partitionable device consuming its GPU's counters. Pod ``i`` asks
  1g.10gb, 2g.20gb, 1g.10gb, 3g.40gb (in turn).

Each pod's claim comes from the ResourceClaimTemplate that
``sharing.admission.dra_claims.pod_claims`` builds for its one container (the webhook's
future DRA path), so pods of one shape share a template. Pods ask 100m CPU
and 256 MiB besides and are created by 8 client threads as fast as the API
server takes them.

Three paths (``--path``, repeatable), one after the other on the same nodes:

* ``dra``: the pods above. Measured: claims allocated per second from the first
  pod's create request to the last claim's allocation (and the steady rate,
  between the 10th and the 90th percentile allocation), pods bound per second,
  create -> bound latency p50/p95, and the pods left Unschedulable with
  kube-scheduler's reason. Then every claim is read back and checked
  (:func:`check_allocations`): each allocated device is one of the node's
  published devices, the pod is bound to that node, no exclusive device is
  allocated twice, no shared GPU gives more ``milli`` or memory than it has,
  and no GPU's counters are overdrawn. How fast claims were created is
  reported too: kube-controller-manager makes them under its client rate limit;
* ``dra-direct``: the same, but each pod references a ResourceClaim with its
  template's spec that this script creates just before the pod (named by
  ``sharing.api.backend.pod_claim_name``, as gpupack's controller is to create
  them): kube-scheduler's rate without kube-controller-manager in the way;
* ``device-plugin``: the DRA pods are deleted, the same nodes are relabelled
  ``gpupack.io/backend=device-plugin`` and advertise in Node status what NVIDIA's
  device plugin would: ``nvidia.com/gpu.shared`` replicas (node ``i`` split as
  finely as the ``i mod 5``-th share from the largest allows, ``sharing.rules.replicas.largest_replicas``,
  labelled with ``nvidia.com/gpu.replicas``; a pod is pinned to the replica
  counts that hold its share, as the webhook pins it), or, for ``mig``, a static
  layout of 3g.40gb + 2g.20gb + 2 x 1g.10gb on every GPU as ``nvidia.com/mig-*``.
  The same pods then ask one of those resources. Measured: pods bound per
  second and create -> bound latency.

Times are taken by this script's watches (the client's clock when the event
arrives), so they include the watch's delivery; the script shares the CPU with
the control plane. Progress goes to stderr; ``--json`` prints the results on
stdout; ``--out FILE`` merges them into FILE (``benchmarks/dra_claims.json``),
replacing earlier runs of the same nodes, pods, variant and path. Results and
what they mean: ``benchmarks/dra_claims.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, TextIO

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpupack.demo.progress import percentile  # noqa: E402
from mig.catalog import get_model  # noqa: E402
from mig.geometry import fits  # noqa: E402
from mig.model import GpuModel  # noqa: E402
from mig.units import parse_quantity  # noqa: E402
from node.advertising.dra_offers import OfferRules, node_offer  # noqa: E402
from node.advertising.dra_pool import plan  # noqa: E402
from node.nvml.simulated import SimulatedNvml  # noqa: E402
from node.base.settings import AgentSettings  # noqa: E402
from node.base.snapshot import read_snapshot  # noqa: E402
from sharing.admission.decision import ContainerDecision  # noqa: E402
from sharing.dra import names, validate, wire  # noqa: E402
from sharing.admission.dra_claims import PodClaims, pod_claims  # noqa: E402
from sharing.dra.model import ResourceSlice  # noqa: E402
from sharing.dra.share_policy import SHARES as SHARE_POLICY  # noqa: E402
from sharing.dra.slices import node_slices  # noqa: E402
from sharing.api.backend import POD_CLAIM, pod_claim_name  # noqa: E402
from sharing.api.keys import BACKEND_LABEL, PRODUCT_LABEL, REPLICAS_LABEL, SHARED_RESOURCE, STRATEGY_LABEL  # noqa: E402
from sharing.rules.replicas import MAX_MILLI, fits_replicas, largest_replicas  # noqa: E402

Variant = Literal["shared", "mig"]
Path_ = Literal["dra", "dra-direct", "device-plugin"]
VARIANTS: Final[tuple[Variant, ...]] = ("shared", "mig")
PATHS: Final[tuple[Path_, ...]] = ("dra", "dra-direct", "device-plugin")
NAMESPACE_SUFFIX: Final[Mapping[Path_, str]] = {"dra": "dra", "dra-direct": "drad", "device-plugin": "dp"}
GPUS_PER_NODE: Final = 8
SHARES: Final = (100, 200, 300, 400, 500)
"""Pod ``i`` of the shared variant asks ``SHARES[i % 5]`` milli."""
PROFILES: Final = ("1g.10gb", "2g.20gb", "1g.10gb", "3g.40gb")
"""Pod ``i`` of the MIG variant asks ``PROFILES[i % 4]``: the mix of the device-plugin path's static layout."""
STATIC_LAYOUT: Final = ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")
"""The device-plugin path's MIG layout on every GPU: the pods' mix, 8 memory and 7 compute slices."""
SHARED_MODEL: Final = get_model("H100-80GB")
MIG_MODELS: Final = (get_model("H100-80GB"), get_model("A100-80GB"))
NODE_RESOURCES: Final = {"cpu": "64", "memory": "512Gi", "pods": "250"}
POD_REQUESTS: Final = {"cpu": "100m", "memory": "256Mi"}
RUN_LABEL: Final = "bench.gpupack.io/run"
"""Nodes and pods of one run carry its id, so runs sharing a control plane never meet."""
CLIENT_THREADS: Final = 8
WATCH_SECONDS: Final = 5
"""Each watch's server-side timeout; the next resumes from the last resourceVersion seen."""
AGENT = AgentSettings()
"""The agent's defaults: share policy (50 milli, 1 GiB) and no whole-GPU device on MIG GPUs."""


# ------------------------------------------------------------------ the workload, pure
def model_of(variant: Variant, node_index: int) -> GpuModel:
    return SHARED_MODEL if variant == "shared" else MIG_MODELS[node_index % len(MIG_MODELS)]


def node_gpus(variant: Variant, node: str, node_index: int, gpus: int = GPUS_PER_NODE) -> SimulatedNvml:
    """The node's GPUs as its agent would read them (SIMULATED NVML: MIG on for ``mig``)."""
    return SimulatedNvml(model_of(variant, node_index), gpus, seed=node, mig_enabled=variant == "mig")


def pool_of(variant: Variant, node: str, node_index: int, owner_uid: str | None,
            gpus: int = GPUS_PER_NODE) -> tuple[ResourceSlice, ...]:
    """The node's pool as the agent publishes it first (``DraPublisher.publish`` with a SharingPolicy that
    allows every profile and reshaping now; sharing mode ``mps`` for the shared variant)."""
    nvml = node_gpus(variant, node, node_index, gpus)
    rules = OfferRules(sharing="mps" if variant == "shared" else "none", whole_gpu=AGENT.dra_whole_gpu,
                       share=SHARE_POLICY)
    offer = node_offer(read_snapshot(nvml, nvml.kind), (), rules)
    if offer.problems or offer.withdrawn:
        raise RuntimeError(f"{node}: {offer.problems} {offer.withdrawn}")
    wanted = node_slices(node, offer.gpus, generation=0, owner_uid=owner_uid)
    validate.check(wanted)
    first = plan(wanted, {})  # a new pool: every slice created, at generation 1
    assert first is not None
    return first.slices


def container(variant: Variant, pod_index: int) -> ContainerDecision:
    """Pod ``pod_index``'s one GPU container, as the webhook decides it (the device-plugin resource too)."""
    if variant == "shared":
        return ContainerDecision("containers", 0, "main", SHARES[pod_index % len(SHARES)], None, SHARED_RESOURCE)
    profile = SHARED_MODEL.profile(PROFILES[pod_index % len(PROFILES)])
    return ContainerDecision("containers", 0, "main", MAX_MILLI * profile.compute_slices // SHARED_MODEL.compute_slices,
                             None, profile.resource_name, profile.name)


def claims_of(variant: Variant, pod_index: int) -> PodClaims:
    return pod_claims("mps" if variant == "shared" else "mig", [container(variant, pod_index)], SHARE_POLICY)


def dra_pod(variant: Variant, pod_index: int, run: str, claim: str | None = None) -> dict[str, Any]:
    """A pod of the DRA pool with its claim template patched in (``pod_claims``'s pod data), or, with
    ``claim``, referencing that ResourceClaim instead (:func:`direct_claim`)."""
    shape = claims_of(variant, pod_index)
    (only,) = shape.containers
    references: list[Any] = list(shape.pod_claims)
    if claim is not None:
        references = [{"name": POD_CLAIM, "resourceClaimName": claim}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{pod_index:05d}", "labels": {RUN_LABEL: run}},
            "spec": {"nodeSelector": {BACKEND_LABEL: "dra", RUN_LABEL: run},
                     "resourceClaims": references,
                     "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": dict(POD_REQUESTS),
                                                   "claims": [dict(c) for c in only.claims]}}]}}


def direct_claim(variant: Variant, pod_index: int, name: str) -> dict[str, Any]:
    """The ResourceClaim of pod ``pod_index`` itself, with its template's spec: what gpupack's controller is
    to create for a DRA pod (``sharing.api.backend``), and what kube-controller-manager would make of the template."""
    shape = claims_of(variant, pod_index)
    return {"apiVersion": names.API_VERSION, "kind": "ResourceClaim",
            "metadata": {"name": name, "labels": dict(shape.template_spec["metadata"]["labels"])},
            "spec": shape.template_spec["spec"]}


def shared_replicas(node_index: int) -> int:
    """Node ``i``'s replicas on the device-plugin path: as fine as the ``i mod 5``-th share from the
    largest allows (2, 2, 3, 5, 8, 2, ...: any three nodes hold every share)."""
    return largest_replicas(SHARES[-1 - node_index % len(SHARES)])


def device_plugin_resources(variant: Variant, node_index: int, gpus: int = GPUS_PER_NODE) -> dict[str, str]:
    """What NVIDIA's device plugin would advertise for the node's GPUs."""
    if variant == "shared":
        return {SHARED_RESOURCE: str(gpus * shared_replicas(node_index))}
    layout = fits(model_of(variant, node_index), STATIC_LAYOUT)
    assert layout is not None, STATIC_LAYOUT
    counts = Counter(model_of(variant, node_index).profile(i.profile).resource_name for i in layout)
    return {resource: str(count * gpus) for resource, count in counts.items()}


def device_plugin_labels(variant: Variant, node_index: int) -> dict[str, str]:
    labels = {BACKEND_LABEL: "device-plugin", PRODUCT_LABEL: model_of(variant, node_index).product}
    if variant == "shared":
        labels.update({STRATEGY_LABEL: "mps", REPLICAS_LABEL: str(shared_replicas(node_index))})
    return labels


def device_plugin_pod(variant: Variant, pod_index: int, run: str) -> dict[str, Any]:
    """The same pod asking the device plugin's resource; a share is pinned to the replica counts that hold it."""
    decided = container(variant, pod_index)
    spec: dict[str, Any] = {
        "nodeSelector": {BACKEND_LABEL: "device-plugin", RUN_LABEL: run},
        "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                        "resources": {"requests": dict(POD_REQUESTS), "limits": {decided.resource: "1"}}}]}
    if variant == "shared":
        memory = SHARED_MODEL.memory_mib * 2**20
        holding = sorted({shared_replicas(i) for i in range(len(SHARES))
                          if fits_replicas(shared_replicas(i), decided.milli, decided.memory_bytes, memory)})
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": REPLICAS_LABEL, "operator": "In", "values": [str(r) for r in holding]}]}]}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{pod_index:05d}", "labels": {RUN_LABEL: run}},
            "spec": spec}


# ------------------------------------------------------------------ reading the claims back
@dataclass(frozen=True)
class Check:
    """What the allocated claims hold, and every rule they break (empty: none)."""

    allocated: int
    devices: int
    """Distinct devices allocated."""
    gpus: int
    """Distinct GPUs (pool, GPU index) holding at least one claim."""
    problems: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"allocated": self.allocated, "devices": self.devices, "gpus": self.gpus,
                "problems": list(self.problems)}


def allocation_results(claim: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``status.allocation.devices.results`` (empty: not allocated)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("results") or [])


def owner_pod(claim: Mapping[str, Any]) -> str | None:
    """The pod the claim is reserved for (kube-scheduler's ``status.reservedFor``), else the pod that owns it."""
    reserved = [r["name"] for r in (claim.get("status") or {}).get("reservedFor") or [] if r.get("resource") == "pods"]
    owners = [o["name"] for o in (claim.get("metadata") or {}).get("ownerReferences") or [] if o.get("kind") == "Pod"]
    return next(iter(reserved + owners), None)


def check_allocations(claims: Iterable[Mapping[str, Any]], pools: Mapping[str, Sequence[ResourceSlice]],
                      bound: Mapping[str, str] | None = None) -> Check:
    """Check allocated claims against the published pools (pool name -> slices).

    ``bound``: pod name -> node; given, a claim's owning pod must be bound to its
    devices' node. Consumed capacities and counters are added up per device and
    per counter set and compared with what was published.
    """
    devices = {(pool, d.name): (s.node_name, d) for pool, slices in pools.items() for s in slices for d in s.devices}
    totals = {(pool, c.name): c.counters for pool, slices in pools.items() for s in slices for c in s.shared_counters}
    holders: dict[tuple[str, str], list[str]] = defaultdict(list)
    consumed: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    drawn: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    problems: list[str] = []
    allocated = 0
    for claim in claims:
        name = str((claim.get("metadata") or {}).get("name"))
        results = allocation_results(claim)
        if not results:
            continue
        allocated += 1
        for result in results:
            key = (str(result.get("pool")), str(result.get("device")))
            if result.get("driver") != names.DRIVER or key not in devices:
                problems.append(f"claim {name}: {result.get('driver')}/{key[0]}/{key[1]} is no published device")
                continue
            node, device = devices[key]
            pod = owner_pod(claim)
            if bound is not None and (pod is None or bound.get(pod) != node):
                problems.append(f"claim {name}: device on {node}, its pod {pod} bound to {bound.get(pod or '')}")
            holders[key].append(name)
            if device.allow_multiple_allocations:
                used = result.get("consumedCapacity") or {}
                if set(used) != set(device.capacity):
                    problems.append(f"claim {name}: consumed {sorted(used)} of a device with {sorted(device.capacity)}")
                for capacity, amount in used.items():
                    consumed[key][capacity] += int(parse_quantity(amount))
            for use in device.consumes_counters:
                drawn[(key[0], use.counter_set)].update(use.counters)
    for key, claimed in holders.items():
        if len(claimed) > 1 and not devices[key][1].allow_multiple_allocations:
            problems.append(f"{key[0]}/{key[1]} is exclusive and allocated to {sorted(claimed)}")
    for key, used in consumed.items():
        for capacity, amount in used.items():
            have = devices[key][1].capacity[capacity].value
            if amount > have:
                problems.append(f"{key[0]}/{key[1]}: claims consume {amount} of {capacity}, it has {have}")
    for key, used in drawn.items():
        for counter, amount in used.items():
            if amount > totals.get(key, {}).get(counter, 0):
                problems.append(f"{key[0]} counter set {key[1]}: {counter} overdrawn ({amount})")
    gpus = {(key[0], devices[key][1].attributes[names.INDEX]) for key in holders}
    return Check(allocated, len(holders), len(gpus), tuple(problems))


# ------------------------------------------------------------------ watching, on the wire
def raw(response: Any) -> Any:
    """A ``_preload_content=False`` response's JSON."""
    return json.loads(response.data)


class FirstSeen:
    """Watches a namespace's objects from before the first create: when each was first seen in a state.

    ``done(obj)`` says whether ``obj`` reached the state (a pod bound, a claim
    allocated); ``at[name]`` is the monotonic time its event arrived here and
    ``latest[name]`` the object as last seen.
    """

    def __init__(self, list_call: Callable[..., Any], namespace: str, done: Callable[[Mapping[str, Any]], bool]) -> None:
        self.list_call, self.namespace, self.done = list_call, namespace, done
        self.at: dict[str, float] = {}
        self.first: dict[str, float] = {}
        """When each object was first seen at all."""
        self.latest: dict[str, Mapping[str, Any]] = {}
        self.ready = threading.Event()
        self.stopped = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"watch-{namespace}")

    def start(self) -> FirstSeen:
        self._thread.start()
        if not self.ready.wait(60):
            raise RuntimeError(f"the watch of {self.namespace} did not start: {self.error!r}")
        return self

    def stop(self) -> None:
        self.stopped = True
        self._thread.join(2 * WATCH_SECONDS)

    def _see(self, obj: Mapping[str, Any], now: float) -> None:
        name = str(obj["metadata"]["name"])
        self.latest[name] = obj
        self.first.setdefault(name, now)
        if name not in self.at and self.done(obj):
            self.at[name] = now

    def _run(self) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        try:
            listed = raw(self.list_call(self.namespace, _preload_content=False))
            for item in listed["items"]:
                self._see(item, time.monotonic())
            version = listed["metadata"]["resourceVersion"]
            self.ready.set()
            while not self.stopped:  # short watches, resumed where the last one ended, so stop() takes effect soon
                response = self.list_call(self.namespace, watch=True, timeout_seconds=WATCH_SECONDS,
                                          allow_watch_bookmarks=True, resource_version=version, _preload_content=False)
                for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        raise RuntimeError(f"watch error: {event.get('object')}")
                    version = event["object"]["metadata"]["resourceVersion"]
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self._see(event["object"], time.monotonic())
                response.release_conn()
        except BaseException as exc:  # noqa: BLE001 - reported by the phase, not by a thread's traceback
            self.error = exc
            self.ready.set()


def pod_bound(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


def claim_allocated(claim: Mapping[str, Any]) -> bool:
    return bool(allocation_results(claim))


def unschedulable_reason(pod: Mapping[str, Any]) -> str | None:
    """kube-scheduler's message on an Unschedulable pod (its preemption postscript cut off); None otherwise."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            if condition.get("reason") == "Unschedulable":
                return str(condition.get("message") or "").split(" preemption:")[0].rstrip(" .")
    return None


# ------------------------------------------------------------------ the phases
@dataclass
class Cluster:
    """The admin's API handles, the run's id and what it published."""

    api: Any
    run: str
    log: TextIO = sys.stderr
    pools: dict[str, tuple[ResourceSlice, ...]] = field(default_factory=dict)
    node_names: list[str] = field(default_factory=list)

    @property
    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api)

    @property
    def resource(self) -> Any:
        from kubernetes import client

        return client.ResourceV1Api(self.api)

    def say(self, message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=self.log, flush=True)


def parallel(work: Callable[[int], Any], count: int) -> list[Any]:
    with ThreadPoolExecutor(CLIENT_THREADS) as pool:
        return list(pool.map(work, range(count)))


def publish_nodes(cluster: Cluster, variant: Variant, nodes: int, gpus: int = GPUS_PER_NODE) -> dict[str, Any]:
    """Create the run's Nodes (Ready, no kubelet) and publish each one's pool; what was published."""
    core, resource = cluster.core, cluster.resource
    began = time.monotonic()

    def make(n: int) -> tuple[str, tuple[ResourceSlice, ...]]:
        name = f"{cluster.run}-{variant}-{n:04d}"
        created = raw(core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, BACKEND_LABEL: "dra", RUN_LABEL: cluster.run,
            PRODUCT_LABEL: model_of(variant, n).product}}}, _preload_content=False))
        core.patch_node_status(name, {"status": {
            "capacity": dict(NODE_RESOURCES), "allocatable": dict(NODE_RESOURCES),
            "conditions": [{"type": "Ready", "status": "True", "reason": "Bench", "message": "no kubelet"}]}},
            _preload_content=False).data
        slices = pool_of(variant, name, n, str(created["metadata"]["uid"]), gpus)
        for item in slices:
            resource.create_resource_slice(wire.slice_json(item), _preload_content=False).data
        if n and n % 100 == 0:
            cluster.say(f"  {n} nodes published")
        return name, slices

    made = parallel(make, nodes)
    cluster.node_names = [name for name, _ in made]
    cluster.pools = dict(made)
    slices = [s for _, pool in made for s in pool]
    devices = [d for s in slices for d in s.devices]
    return {"nodes": nodes, "gpus": nodes * gpus, "slices": len(slices), "devices": len(devices),
            "devices_per_node": len(devices) // max(1, nodes), "publish_seconds": round(time.monotonic() - began, 1)}


def to_device_plugin(cluster: Cluster, variant: Variant, gpus: int = GPUS_PER_NODE) -> float:
    """Relabel the run's nodes to the device-plugin pool and advertise its resources; seconds taken."""
    core, began = cluster.core, time.monotonic()

    def switch(n: int) -> None:
        name = cluster.node_names[n]
        core.patch_node(name, {"metadata": {"labels": device_plugin_labels(variant, n)}}, _preload_content=False).data
        advertised = {**NODE_RESOURCES, **device_plugin_resources(variant, n, gpus)}
        core.patch_node_status(name, {"status": {"capacity": advertised, "allocatable": advertised}},
                               _preload_content=False).data

    parallel(switch, len(cluster.node_names))
    return round(time.monotonic() - began, 1)


def rate(times: Sequence[float], start: float) -> tuple[float | None, float | None]:
    """(count / seconds from ``start`` to the last, count per second between the 10th and 90th percentile)."""
    if not times:
        return None, None
    ordered = sorted(times)
    overall = len(ordered) / max(ordered[-1] - start, 1e-9)
    low, high = int(0.1 * (len(ordered) - 1)), int(0.9 * (len(ordered) - 1))
    steady = (high - low) / (ordered[high] - ordered[low]) if high > low and ordered[high] > ordered[low] else None
    return round(overall, 1), None if steady is None else round(steady, 1)


def seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def run_phase(cluster: Cluster, variant: Variant, path: Path_, pods: int, *, timeout_s: float = 900,
              settle_s: float = 20, progress_s: float = 10) -> dict[str, Any]:
    """Create ``pods`` pods of ``path`` in a fresh namespace; wait until every one is bound or, for
    ``settle_s`` with no progress, every one left is Unschedulable (or ``timeout_s``); measure."""
    core, resource = cluster.core, cluster.resource
    namespace = f"{cluster.run}-{variant}-{NAMESPACE_SUFFIX[path]}"
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
                          _preload_content=False).data
    bound_w = FirstSeen(core.list_namespaced_pod, namespace, pod_bound).start()
    claims_w = (FirstSeen(resource.list_namespaced_resource_claim, namespace, claim_allocated).start()
                if path != "device-plugin" else None)
    if path == "dra":
        templates = {claims_of(variant, i).template_name: claims_of(variant, i) for i in range(min(pods, 20))}
        for shape in templates.values():
            resource.create_namespaced_resource_claim_template(namespace, shape.template(namespace),
                                                               _preload_content=False).data
    claim_names = [pod_claim_name(f"{namespace}/{i}") if path == "dra-direct" else None for i in range(pods)]
    bodies = [device_plugin_pod(variant, i, cluster.run) if path == "device-plugin"
              else dra_pod(variant, i, cluster.run, claim_names[i]) for i in range(pods)]
    sent: dict[str, float] = {}

    def create(i: int) -> None:
        body, claim = bodies[i], claim_names[i]
        sent[body["metadata"]["name"]] = time.monotonic()
        if claim is not None:
            resource.create_namespaced_resource_claim(namespace, direct_claim(variant, i, claim),
                                                      _preload_content=False).data
        core.create_namespaced_pod(namespace, body, _preload_content=False).data

    cluster.say(f"{variant}/{path}: creating {pods} pods in {namespace}")
    start = time.monotonic()
    creator = threading.Thread(target=parallel, args=(create, pods), daemon=True)
    creator.start()
    last_count, last_change, last_say = -1, start, start
    while True:
        time.sleep(0.5)
        now = time.monotonic()
        for watcher in (bound_w, claims_w):
            if watcher is not None and watcher.error is not None:
                raise RuntimeError(f"watch of {namespace} failed: {watcher.error!r}")
        bound = len(bound_w.at)
        allocated = len(claims_w.at) if claims_w else None
        count = bound + (allocated or 0)
        if count != last_count:
            last_count, last_change = count, now
        created = creator.is_alive() is False
        if now - last_say >= progress_s:
            last_say = now
            cluster.say(f"  {variant}/{path}: {len(sent)} created, {bound} bound"
                        + (f", {allocated} claims allocated" if allocated is not None else "")
                        + f", {now - start:.0f} s")
        if created and bound >= pods:
            break
        if created and now - last_change >= settle_s:
            waiting = [bound_w.latest.get(b["metadata"]["name"]) for b in bodies
                       if b["metadata"]["name"] not in bound_w.at]
            if all(p is not None and unschedulable_reason(p) is not None for p in waiting):
                break
        if now - start > timeout_s:
            cluster.say(f"  {variant}/{path}: timed out after {timeout_s:.0f} s")
            break
    bound_w.stop()
    if claims_w is not None:
        claims_w.stop()
    creator.join()
    elapsed = max(bound_w.at.values(), default=start) - start
    latencies = [bound_w.at[name] - sent[name] for name in bound_w.at if name in sent]
    pods_per_s, pods_steady = rate(list(bound_w.at.values()), start)
    listed = raw(core.list_namespaced_pod(namespace, _preload_content=False))["items"]
    reasons = Counter(r for p in listed if not pod_bound(p) and (r := unschedulable_reason(p)) is not None)
    result: dict[str, Any] = {
        "variant": variant, "path": path, "nodes": len(cluster.node_names), "gpus": len(cluster.node_names) * GPUS_PER_NODE,
        "pods": pods, "create_seconds": None, "bound": len(bound_w.at),
        "seconds_to_last_bound": seconds(elapsed), "pods_per_second": pods_per_s, "pods_per_second_steady": pods_steady,
        "bound_latency_p50_s": seconds(percentile(latencies, 50)),
        "bound_latency_p95_s": seconds(percentile(latencies, 95)),
        "bound_latency_max_s": seconds(max(latencies, default=None)),
        "unschedulable": sum(reasons.values()), "unschedulable_reasons": dict(reasons.most_common()),
        "pending_not_yet_tried": sum(1 for p in listed if not pod_bound(p) and unschedulable_reason(p) is None),
    }
    result["create_seconds"] = seconds(max(sent.values()) - start) if sent else None
    if claims_w is not None:
        claims = raw(resource.list_namespaced_resource_claim(namespace, _preload_content=False))["items"]
        claims_per_s, claims_steady = rate(list(claims_w.at.values()), start)
        made_per_s, _ = rate(list(claims_w.first.values()), start)
        waits = [claims_w.at[c] - claims_w.first[c] for c in claims_w.at]
        result.update({
            "claims_from": "template" if path == "dra" else "created by this script, one per pod",
            "claims": len(claims), "claims_created_per_second": made_per_s,
            "claim_created_to_allocated_p50_s": seconds(percentile(waits, 50)),
            "claim_created_to_allocated_p95_s": seconds(percentile(waits, 95)),
            "claims_allocated": len(claims_w.at),
            "seconds_to_last_allocated": seconds(max(claims_w.at.values(), default=start) - start),
            "claims_per_second": claims_per_s, "claims_per_second_steady": claims_steady,
            "check": check_allocations(claims, cluster.pools,
                                       {p["metadata"]["name"]: p["spec"]["nodeName"] for p in listed if pod_bound(p)}
                                       ).as_dict(),
        })
    result["namespace"] = namespace
    cluster.say(f"{variant}/{path}: {result['bound']}/{pods} bound in {elapsed:.1f} s "
                f"({pods_per_s} pods/s), p50 {result['bound_latency_p50_s']} s, p95 {result['bound_latency_p95_s']} s"
                + (f", {result['claims_allocated']} claims allocated ({result['claims_per_second']}/s)"
                   if claims_w is not None else "") + f", {result['unschedulable']} unschedulable")
    return result


def delete_pods(cluster: Cluster, namespace: str, timeout_s: float = 300) -> None:
    """Delete a phase's pods at once (no kubelet: grace 0 removes them) and wait until they are gone."""
    core = cluster.core
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0, _preload_content=False).data
    deadline = time.monotonic() + timeout_s
    while raw(core.list_namespaced_pod(namespace, limit=1, _preload_content=False))["items"]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the pods of {namespace} were not deleted in {timeout_s:.0f} s")
        time.sleep(1)


def run_variant(api: Any, variant: Variant, nodes: int, pods: int, paths: Sequence[Path_] = PATHS, *,
                gpus: int = GPUS_PER_NODE, run: str | None = None, log: TextIO = sys.stderr,
                timeout_s: float = 900, settle_s: float = 20, keep_pods: bool = False) -> tuple[Cluster, list[dict[str, Any]]]:
    """The benchmark's core on a running control plane (``api``: an admin ``ApiClient``; kube-scheduler,
    kube-controller-manager and ``manifests/dra`` in place): nodes, pools, then each path's phase.

    ``keep_pods``: leave the last phase's pods (and so the DRA claims) in place to be read back.
    """
    cluster = Cluster(api, run or f"b{uuid.uuid4().hex[:5]}", log)
    cluster.say(f"{variant}: publishing {nodes} nodes x {gpus} GPUs")
    setup = publish_nodes(cluster, variant, nodes, gpus)
    cluster.say(f"{variant}: {setup['slices']} slices, {setup['devices']} devices in {setup['publish_seconds']} s")
    results: list[dict[str, Any]] = []
    for path in paths:
        if results:
            delete_pods(cluster, results[-1]["namespace"])
        extra: dict[str, Any] = dict(setup)
        if path == "device-plugin":  # last: the nodes leave the DRA pool
            extra = {"nodes": nodes, "gpus": nodes * gpus, "advertise_seconds": to_device_plugin(cluster, variant, gpus)}
        result = run_phase(cluster, variant, path, pods, timeout_s=timeout_s, settle_s=settle_s)
        results.append({**extra, **result})
    if results and not keep_pods:
        delete_pods(cluster, results[-1]["namespace"])
    return cluster, results


# ------------------------------------------------------------------ the command
def machine() -> dict[str, Any]:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    return {"cpu": model, "nproc": len(os.sched_getaffinity(0)), "cpus_online": os.cpu_count(),
            "python": platform.python_version(), "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}


def merge(out: Path, runs: list[dict[str, Any]]) -> None:
    """Put ``runs`` into ``out``'s list, replacing runs of the same nodes, pods, variant and path."""
    doc = json.loads(out.read_text()) if out.exists() else {}
    key: Callable[[Mapping[str, Any]], tuple[Any, ...]] = lambda r: (r["nodes"], r["pods"], r["variant"], r["path"])
    fresh = {key(r) for r in runs}
    kept = [r for r in doc.get("runs", []) if key(r) not in fresh]
    doc = {"benchmark": "benchmarks/dra_claims.py", "about": "see benchmarks/dra_claims.md",
           "runs": sorted(kept + runs, key=key)}
    out.write_text(json.dumps(doc, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100, help="Node objects (8 GPUs each; default 100)")
    parser.add_argument("--pods", type=int, default=None, help="pods per path and variant (default 10 per node)")
    parser.add_argument("--variant", choices=(*VARIANTS, "both"), default="both")
    parser.add_argument("--path", choices=(*PATHS, "all"), action="append",
                        help="dra (claims from templates), dra-direct (claims created by this script), device-plugin; "
                             "repeatable; default all, in that order, on the same nodes")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a phase may take (default 900)")
    parser.add_argument("--settle", type=float, default=20,
                        help="seconds without progress after which pods all Unschedulable end a phase (default 20)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    parser.add_argument("--out", type=Path, help="merge the results into this JSON file (e.g. benchmarks/dra_claims.json)")
    args = parser.parse_args(argv)
    pods = args.pods if args.pods is not None else 10 * args.nodes
    variants: tuple[Variant, ...] = VARIANTS if args.variant == "both" else (args.variant,)
    paths: tuple[Path_, ...] = tuple(p for p in PATHS if not args.path or "all" in args.path or p in args.path)

    from gpupack.devcluster.apply import MANIFESTS, apply_objects, load_manifests
    from gpupack.devcluster.binaries import ensure_binaries
    from gpupack.devcluster.controlplane import ControlPlane, ControlPlaneConfig

    command = "python benchmarks/dra_claims.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    host = machine()
    binaries = ensure_binaries(progress=sys.stderr, controller_manager=True)
    runs: list[dict[str, Any]] = []
    for variant in variants:  # a fresh control plane per variant: one variant's objects never slow the other
        plane = ControlPlane(binaries, ControlPlaneConfig(controller_manager=True)).start()
        try:
            with plane.admin_client() as api:
                apply_objects(api, load_manifests(MANIFESTS / "dra" / "deviceclasses.yaml"), field_manager="bench")
                _, results = run_variant(api, variant, args.nodes, pods, paths, timeout_s=args.timeout,
                                         settle_s=args.settle, keep_pods=True)
        finally:
            plane.stop()
        runs += [{**r, "command": command, "machine": host} for r in results]
    if args.out:
        merge(args.out, runs)
    if args.json:
        print(json.dumps(runs, indent=2))
    else:
        for r in runs:
            print(f"{r['variant']:6} {r['path']:13} nodes {r['nodes']:5} pods {r['pods']:5} bound {r['bound']:5} "
                  f"pods/s {r['pods_per_second']} (steady {r['pods_per_second_steady']}) "
                  f"p50 {r['bound_latency_p50_s']} s p95 {r['bound_latency_p95_s']} s "
                  + (f"claims/s {r['claims_per_second']} (steady {r['claims_per_second_steady']}) "
                     f"check {len(r['check']['problems'])} problem(s) " if "check" in r else "")
                  + f"unschedulable {r['unschedulable']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
