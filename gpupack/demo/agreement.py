"""Does the live DRA path place what the simulator's DRA model places? (issue 15, "Numbers")

Runs the demo's stack as a DRA node pool (``Stack(backend="dra")``: real
control plane with kube-scheduler and kube-controller-manager, the agents
publishing ResourceSlices, the webhook, the controller) on shared nodes only,
submits fractional pods **one at a time** and waits, for each, until its
ResourceClaim is allocated or the controller has left it waiting; then replays
the same pods, in the same order, through the simulator's DRA model
(:class:`sharing.simulator.dra.DraReplay`, the one ``gpupack simulate --model
product --backend dra`` runs) on the same nodes, and compares pod by pod.

Why these conditions: the model's protocol has pods arrive one by one and
never leave; submitting one at a time and never deleting is that protocol, so
any difference is the live system's, not the arrival process's. Shared nodes
only, because the DRA model replays consumable-capacity shares (openb has no
MIG-capable GPU type); pods ask no GPU memory (the model has none; each claim
takes the request policy's default, one unit). :func:`shared_pods` ask no CPU;
:func:`mixed_pods` ask CPU and mix in pods that ask for no GPU, which the engine
places too (docs/dra-pods.md, "Pods that ask for no GPU"), as the model's
``cpu_pods="engine"`` does.

What is compared: which pods were placed (live: claim allocated; model: the
replay placed it), the allocation (milli asked by placed pods over all GPU
milli), and for pods placed by both, whether on the same node and GPU.

**MIG** (:func:`mig_pods`, :func:`mig_model_placements`): the same, on nodes
whose GPUs run MIG in dynamic mode (every placement of every profile
published, the plugin creating each claim's instance), against the DRA model on
MIG GPUs (:class:`sharing.simulator.dra_mig.DraMigReplay`, the engine's choice:
``sharing.dra.mig_choice.place_pod``). Each pod asks ``gpupack.io/sharing: mig``
with the compute and memory of the openb mapping (``profile_for``: the memory
share equal to the compute share), so the webhook picks the profile the model
asks; the pods ask CPU, so the node score's CPU part counts. Compared per pod:
the node and the device (GPU, profile and placement start).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np

from gpupack.demo.stack import DEMO_NAMESPACE, DemoNode, Stack
from gpupack.demo.workload import SHAPES, DemoPod
from mig.catalog import get_model
from sharing.api.allocation import Allocation
from sharing.dra.names import mig_device_name, parse_device_name
from sharing.dra.share_policy import DEFAULT_MILLI_STEP
from sharing.api.keys import ALLOCATION_ANNOTATION
from sharing.packing.cluster import ClusterState
from sharing.packing.mig_layouts import full_profile
from sharing.packing.registry import make_policy
from sharing.packing.specs import GPU_MILLI, NodeSpec, PodSpec
from sharing.packing.typical import NO_GPU_POD, TypicalPods
from sharing.simulator.dra import DraReplay, as_claimed
from sharing.simulator.dra_mig import DraMigReplay
from sharing.simulator.scheduler_config import load_weights

NODE_CPU_MILLI = 64_000
NODE_MEMORY_MIB = 512 * 1024
"""What the demo's Node objects report allocatable (``Stack._nodes``)."""

DEFAULT_NODES: tuple[DemoNode, ...] = (
    DemoNode("a100-a", "A100-80GB", 4, sharing="mps"),
    DemoNode("a100-b", "A100-80GB", 4, sharing="mps"),
    DemoNode("h100-a", "H100-80GB", 8, sharing="mps"),
)

Where = tuple[str, int]
"""(node, GPU index)."""
MigWhere = tuple[str, str]
"""(node, device name: ``gpu-<i>-mig-<profile>-<start>``)."""

MIG_NODES: tuple[DemoNode, ...] = (
    DemoNode("h100-mig-a", "H100-80GB", 2),
    DemoNode("h100-mig-b", "H100-80GB", 2),
    DemoNode("h100-mig-c", "H100-80GB", 4),
)
"""MIG nodes of a DRA demo stack (``sharing: none``: the agent's simulated GPUs start with MIG on)."""
MIG_MODEL = "H100-80GB"
NO_GPU = -1
"""The GPU index of a pod that asks for no GPU (it is placed on a node only)."""
P = TypeVar("P", Where, MigWhere)
"""Where a pod went, as one comparison reads it: (node, GPU) or (node, MIG device)."""


@dataclass(frozen=True)
class Comparison:
    pods: int
    placed_live: int
    placed_model: int
    placed_by_one_only: tuple[str, ...]
    allocation_live: float
    allocation_model: float
    same_gpu: int
    """Pods both placed on the same node and GPU."""
    placed_by_both: int
    allocation_model_workload: float | None = None
    """The model with the FGD protocol's typical pods (the whole run's), for reference."""

    def as_json(self) -> dict[str, Any]:
        return {
            "pods": self.pods, "placed_live": self.placed_live, "placed_model": self.placed_model,
            "placed_by_one_only": list(self.placed_by_one_only),
            "allocation_live_percent": round(100 * self.allocation_live, 2),
            "allocation_model_percent": round(100 * self.allocation_model, 2),
            "same_gpu": self.same_gpu, "placed_by_both": self.placed_by_both,
            "allocation_model_workload_typical_percent": None if self.allocation_model_workload is None
            else round(100 * self.allocation_model_workload, 2),
        }


def shared_pods(count: int, seed: int) -> tuple[DemoPod, ...]:
    """``count`` MPS pods with the demo's compute shapes (no memory ask), in a seeded order."""
    rng = random.Random(seed)
    shapes = [(milli, weight) for milli, memory, mode, weight in SHAPES if mode != "mig" and milli < GPU_MILLI]
    millis = rng.choices([m for m, _ in shapes], [w for _, w in shapes], k=count)
    return tuple(DemoPod(f"share-{i:03d}", m, None, "mps", 0.0, None) for i, m in enumerate(millis))


def mixed_pods(count: int, seed: int, cpu_only_every: int = 3) -> tuple[DemoPod, ...]:
    """:func:`shared_pods` that ask for CPU too (4 to 12 cores), every ``cpu_only_every``-th of them
    replaced by a pod asking for no GPU and 8 to 32 cores, which the engine places as well: so
    CPU can run out before the GPUs do, and where the CPU-only pods go decides which GPUs stay
    usable (docs/simulator.md, "DRA model results")."""
    rng = random.Random(seed + 1)
    pods = []
    for i, pod in enumerate(shared_pods(count, seed)):
        if (i + 1) % cpu_only_every == 0:
            pods.append(DemoPod(f"cpu-{i:03d}", 0, None, None, 0.0, None, cpu_milli=rng.randint(8, 32) * 1000))
        else:
            pods.append(replace(pod, cpu_milli=rng.randint(4, 12) * 1000))
    return tuple(pods)


MIG_SHAPES = ((100, 6), (200, 4), (300, 3), (400, 2), (700, 1))
"""(milli, weight) of :func:`mig_pods`: on an H100, 1g.10gb, 2g.20gb, 3g.40gb, 3g.40gb and 7g.80gb."""


def mig_pods(count: int, seed: int) -> tuple[DemoPod, ...]:
    """``count`` MIG pods in a seeded order, each asking 2 to 16 cores and the compute and GPU
    memory of the openb mapping onto an H100 (``profile_for``: memory in the compute's share), so
    the webhook's profile is the model's (module docstring)."""
    rng = random.Random(seed)
    full = full_profile(get_model(MIG_MODEL))
    millis = rng.choices([m for m, _ in MIG_SHAPES], [w for _, w in MIG_SHAPES], k=count)
    return tuple(DemoPod(f"mig-{i:03d}", m, f"{-(-m * full.memory_mib // 1000)}Mi", "mig", 0.0, None,
                         cpu_milli=rng.randint(2, 16) * 1000) for i, m in enumerate(millis))


def mig_model_placements(nodes: Sequence[DemoNode], pods: Sequence[DemoPod]) -> dict[str, MigWhere | None]:
    """The DRA model on MIG GPUs, ``pods`` in order: each pod's (node, device), or None (fit nowhere)."""
    specs = [NodeSpec(n.name, NODE_CPU_MILLI, NODE_MEMORY_MIB, n.gpus, get_model(n.model).product) for n in nodes]
    replay = DraMigReplay(specs, get_model(MIG_MODEL), load_weights(), "engine")
    out: dict[str, MigWhere | None] = {}
    for pod in pods:
        placed = replay.place(PodSpec(pod.name, pod.cpu_milli, 0, 1, pod.milli))
        out[pod.name] = None if not placed else (
            placed[0][0], mig_device_name(placed[0][1], placed[0][2].profile, placed[0][2].placement.start))
    return out


TypicalRule = Literal["arrived", "workload"]


def model_placements(nodes: Sequence[DemoNode], pods: Sequence[DemoPod], policy: str,
                     unit: int = DEFAULT_MILLI_STEP, typical: TypicalRule = "arrived") -> dict[str, Where | None]:
    """The DRA model's replay of ``pods`` in order: each pod's (node, GPU), or None when it fit nowhere.

    ``typical`` is what the fragmentation-aware policies measure fragmentation against:
    ``workload``, every pod of the run, known in advance (the FGD protocol, and the simulator's
    openb figures); ``arrived``, the pods arrived so far, the live controller's rule (it knows
    the pods that exist, ``controller.planning.draplan``), so the policy is rebuilt before each pod.
    """
    ordered = sorted(nodes, key=lambda n: n.name)
    specs = [NodeSpec(n.name, NODE_CPU_MILLI, NODE_MEMORY_MIB, n.gpus, get_model(n.model).product) for n in ordered]
    engine_pods = [PodSpec(p.name, p.cpu_milli, 0, 1 if p.milli else 0, p.milli) for p in pods]

    def typical_of(some: Sequence[PodSpec]) -> TypicalPods:
        # The live controller's typical pods are the pods its engine places (controller.planning.draplan):
        # here every pod, GPU pods as claimed and the ones asking for no GPU as they are.
        return TypicalPods.from_pods([as_claimed(p, unit) for p in some] or [NO_GPU_POD])

    replay = DraReplay(ClusterState(specs), make_policy(policy, rng=np.random.default_rng(0),
                                                        typical=typical_of(engine_pods)),
                       load_weights(), unit, cpu_pods="engine")
    out: dict[str, Where | None] = {}
    for k, pod in enumerate(engine_pods):
        if typical == "arrived":
            replay.policy = make_policy(policy, rng=np.random.default_rng(0), typical=typical_of(engine_pods[:k + 1]))
        before_gpu, before_cpu = replay.cluster.gpu_free.copy(), replay.cluster.cpu_free.copy()
        if replay.place(pod) is None:
            out[pod.name] = None
        elif not pod.gpu_count:
            (taken,) = np.flatnonzero(before_cpu != replay.cluster.cpu_free)
            out[pod.name] = (ordered[int(taken)].name, NO_GPU)
        else:
            node, gpu = (int(x[0]) for x in np.nonzero(before_gpu != replay.cluster.gpu_free))
            out[pod.name] = (ordered[node].name, gpu)
    return out


def _claim_device(admin: Any, pod: str) -> Where | None:
    """Where ``pod``'s ResourceClaim was allocated (None: not yet); for a pod that asks for no GPU,
    the node it is bound to and :data:`NO_GPU`."""
    found = _allocated_device(admin, pod)
    if found is None or found[1] is None:
        return None if found is None else (found[0], NO_GPU)
    return found[0], parse_device_name(found[1]).gpu


def mig_claim_device(admin: Any, pod: str) -> MigWhere | None:
    """The node and device name ``pod``'s ResourceClaim was allocated (None: not yet)."""
    found = _allocated_device(admin, pod)
    return None if found is None or found[1] is None else (found[0], found[1])


def _allocated_device(admin: Any, pod: str) -> tuple[str, str | None] | None:
    """The pool (node) and gpupack device ``pod``'s ResourceClaim was allocated, or None when not
    yet; a pod that asks for no GPU: the node it is bound to and None."""
    from kubernetes import client

    from node.draplugin.claims import ClaimError, ClaimRef, allocation_from_claim
    from sharing.dra.names import DRIVER

    core, custom = client.CoreV1Api(admin), client.CustomObjectsApi(admin)
    obj: Any = core.read_namespaced_pod(pod, DEMO_NAMESPACE)
    record = Allocation.from_annotation((obj.metadata.annotations or {}).get(ALLOCATION_ANNOTATION))
    if record.mode == "cpu":
        return (str(obj.spec.node_name), None) if obj.spec.node_name else None
    try:
        claim: Any = custom.get_namespaced_custom_object("resource.k8s.io", "v1", DEMO_NAMESPACE, "resourceclaims",
                                                         str(record.claim))
    except client.ApiException as exc:
        if exc.status == 404:
            return None  # the engine has not placed it (yet)
        raise
    meta = claim.get("metadata") or {}
    try:
        devices = allocation_from_claim(claim, ClaimRef(str(meta.get("uid")), DEMO_NAMESPACE, str(record.claim)))
    except ClaimError:
        return None  # not allocated yet
    for device in devices:
        if device.driver == DRIVER:
            return device.pool, device.device
    return None


def live_placements(workdir: Path, nodes: Sequence[DemoNode], pods: Sequence[DemoPod], policy: str,
                    say: Callable[[str], None], settle_seconds: float = 8.0,
                    where_of: Callable[[Any, str], P | None] = _claim_device,  # type: ignore[assignment]
                    ) -> dict[str, P | None]:
    """Submit ``pods`` one by one to a DRA demo stack; where each pod's claim was allocated, as
    ``where_of`` reads it (default: node and GPU; :func:`mig_claim_device`: node and device), or None."""
    from kubernetes import client

    stack = Stack(workdir, backend="dra", nodes=tuple(nodes))
    stack.controller_policy = policy
    out: dict[str, P | None] = {}
    try:
        stack.start(say)
        core = client.CoreV1Api(stack.admin)
        for i, pod in enumerate(pods):
            manifest: Any = pod.manifest(DEMO_NAMESPACE)
            core.create_namespaced_pod(DEMO_NAMESPACE, manifest)
            # Wait for the claim's allocation. A pod the engine cannot place stays gated: after
            # several controller cycles (resync 2 s) with no claim, it counts as not placed.
            deadline = time.monotonic() + settle_seconds
            where = None
            while where is None and time.monotonic() < deadline:
                time.sleep(0.2)
                where = where_of(stack.admin, pod.name)
            out[pod.name] = where
            say(f"[{i + 1}/{len(pods)}] {pod.name} ({pod.milli} milli) -> {where or 'not placed'}")
    finally:
        stack.stop()
    return out


def allocation(nodes: Sequence[DemoNode], pods: Sequence[DemoPod], placed: Mapping[str, object | None]) -> float:
    milli = {p.name: p.milli for p in pods}
    return sum(milli[p] for p, w in placed.items() if w) / (sum(n.gpus for n in nodes) * GPU_MILLI)


def compare(nodes: Sequence[DemoNode], pods: Sequence[DemoPod], live: Mapping[str, P | None],
            model: Mapping[str, P | None], model_workload: Mapping[str, P | None] | None = None) -> Comparison:
    both = [p.name for p in pods if live.get(p.name) and model.get(p.name)]
    return Comparison(
        pods=len(pods),
        placed_live=sum(1 for p in pods if live.get(p.name)),
        placed_model=sum(1 for p in pods if model.get(p.name)),
        placed_by_one_only=tuple(p.name for p in pods if bool(live.get(p.name)) != bool(model.get(p.name))),
        allocation_live=allocation(nodes, pods, live),
        allocation_model=allocation(nodes, pods, model),
        same_gpu=sum(1 for p in both if live[p] == model[p]),
        placed_by_both=len(both),
        allocation_model_workload=None if model_workload is None else allocation(nodes, pods, model_workload),
    )
