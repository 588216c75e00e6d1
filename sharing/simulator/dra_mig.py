"""The DRA model on MIG GPUs: openb's pods as MIG claims on partitionable devices.

``gpupack simulate --model product --backend dra --mig MODEL`` (docs/simulator.md,
"The DRA backend on MIG GPUs"). On a DRA node pool in dynamic MIG mode every GPU
publishes every placement of every profile (``sharing.dra.mig_devices``), each
consuming the GPU's counters, so a claim can be given any placement that
overlaps nothing in use: no idle GPU has to be reshaped first. What differs is
who chooses the placement:

- **gpupack's engine** (``gpu_pods="engine"``, the product): the controller's
  choice for a MIG pod, ``sharing.dra.mig_choice.place_pod``, pinned in the
  claim: among the nodes with the pod's CPU and memory free and room for its
  instances, those with the best score on CPU, memory and MIG compute slices
  held (``mig_choice.node_scores``); on them, the GPU and placement after which
  the most valuable profiles still fit (``choose``; ``place_all`` for a pod of
  several GPUs). The model computes the same choice faster: the scores over
  arrays, ``choose`` over one GPU per distinct layout of the best nodes (unit
  tests check it against ``place_pod``).
- **kube-scheduler unguided** (``gpu_pods="scheduler"``): no pins.
  kube-scheduler filters the nodes on which the claim can be allocated (CPU,
  memory, a free placement of each profile asked), scores them MostAllocated on
  CPU and memory (``sharing.simulator.product.scheduler_pick``, the weights
  ``manifests/`` ships), and its allocator takes the first device that fits in
  the slices' order: GPU 0 first and, within a GPU, the profile's placement
  with the highest start first (the order ``sharing.dra.mig_devices``
  publishes).

The cluster is the openb node list with every GPU made a ``model`` GPU (GPU
counts, CPU and memory kept), the arrivals are the protocol's
(``sharing.simulator.arrivals.plan_run``: seeded order, tuned to ``inflate``
times the GPU capacity, pods never leave, a pod that fits nowhere is dropped).
A GPU pod asks for the smallest profile covering its compute and the same share
of memory (``sharing.packing.mig_layouts.profile_for``, the MIG variant's
mapping); a whole-GPU pod for one full-GPU instance per GPU, on one node. Pods
that ask for no GPU are kube-scheduler's in both. ``gpu_spec`` constraints are
dropped (no openb GPU type is MIG-capable). Allocation counts the milli the
placed pods asked for, as every model does; ``occupied_at`` the compute slices
their instances hold.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from sharing.dra.mig_choice import MigGpu, asked_slices, choose, node_scores, place_all
from sharing.dra.mig_devices import placement_order
from mig.geometry import can_add
from mig.model import GpuModel, PlacedInstance
from sharing.packing.cluster import ClusterState
from sharing.packing.kube_scoring import MostAllocatedWeights
from sharing.packing.mig_layouts import full_profile, profile_for
from sharing.packing.specs import GPU_MILLI, NodeSpec, PodSpec
from sharing.simulator.arrivals import plan_run
from sharing.simulator.dra import GPU_PODS, GpuPods
from sharing.simulator.metrics import alloc_by_level
from sharing.simulator.product import scheduler_pick

Layout = tuple[PlacedInstance, ...]



def _any_profile(profile: str) -> bool:
    """Dynamic mode with no policy limits: the agent offers every profile's placements."""
    return True


@dataclass(frozen=True)
class DraMigRun:
    """One seed's run of the DRA model on MIG GPUs."""

    model: str
    gpu_pods: GpuPods
    seed: int
    pods: int
    failed_pods: int
    alloc_at: dict[int, float | None]
    occupied_at: dict[int, float | None]
    """Compute slices the instances hold, in milli of a GPU, per arrived-demand level."""
    final_alloc_percent: float


def profiles_asked(pod: PodSpec, model: GpuModel) -> tuple[str, ...]:
    """The MIG profiles a GPU pod's claims ask for (module docstring); () for a pod without GPUs."""
    if pod.gpu_count == 0:
        return ()
    if pod.is_whole:
        return (full_profile(model).name,) * pod.gpu_count
    return (profile_for(model, pod.gpu_milli).name,)


def first_fit(model: GpuModel, layouts: Sequence[list[PlacedInstance]], profiles: Sequence[str]) -> list[tuple[int, PlacedInstance]] | None:
    """Where kube-scheduler's allocator puts ``profiles`` on one node unguided: for each in turn the
    first device that fits, GPU 0 first, within a GPU the highest start first; None if one does not
    fit. ``layouts`` is not changed."""
    trial = [list(layout) for layout in layouts]
    out: list[tuple[int, PlacedInstance]] = []
    for name in profiles:
        profile = model.profile(name)
        found = None
        for g, layout in enumerate(trial):
            for placement in placement_order(profile):
                instance = PlacedInstance(name, placement)
                if can_add(model, layout, instance) is None:
                    found = (g, instance)
                    break
            if found is not None:
                break
        if found is None:
            return None
        trial[found[0]].append(found[1])
        out.append(found)
    return out


class _Gpus:
    """Every GPU's layout, indexed by layout so the engine's choice costs one call per distinct
    layout rather than one per GPU (GPUs of one layout differ only in the name and index that
    break the engine's ties)."""

    def __init__(self, model: GpuModel, names: Sequence[str], counts: Sequence[int]) -> None:
        self.model = model
        self.names = list(names)
        self.index = {name: n for n, name in enumerate(names)}
        self.layouts: list[list[list[PlacedInstance]]] = [[[] for _ in range(c)] for c in counts]
        self.by_layout: dict[Layout, list[tuple[str, int, int]]] = {(): sorted(
            (names[n], g, n) for n, c in enumerate(counts) for g in range(c))}
        self._fits: dict[tuple[Layout, str], bool] = {}
        self.profiles = [p.name for p in model.profiles]
        self.can_host = np.zeros((len(names), len(self.profiles)), dtype=bool)
        """Per node and profile: a GPU of the node has a free placement of it."""
        self.empty = np.asarray(counts, dtype=np.int64)
        """Per node: GPUs with no instance (what a full-GPU profile needs)."""
        self.slices_held = np.zeros(len(names), dtype=np.int64)
        """Per node: compute slices its instances hold."""
        self.slices_total = model.compute_slices * np.asarray(counts, dtype=np.int64)
        for n in range(len(names)):
            self._refresh(n)

    def fits(self, layout: Layout, profile: str) -> bool:
        key = (layout, profile)
        if key not in self._fits:
            self._fits[key] = first_fit(self.model, [list(layout)], [profile]) is not None
        return self._fits[key]

    def _refresh(self, node: int) -> None:
        layouts = [tuple(sorted(layout)) for layout in self.layouts[node]]
        for p, name in enumerate(self.profiles):
            self.can_host[node, p] = any(self.fits(layout, name) for layout in layouts)
        self.empty[node] = sum(1 for layout in layouts if not layout)

    def add(self, node: int, gpu: int, instance: PlacedInstance) -> None:
        layout = self.layouts[node][gpu]
        before = tuple(sorted(layout))
        entry = (self.names[node], gpu, node)
        members = self.by_layout[before]
        members.pop(bisect.bisect_left(members, entry))
        if not members:
            del self.by_layout[before]
        layout.append(instance)
        self.slices_held[node] += self.model.profile(instance.profile).compute_slices
        bisect.insort(self.by_layout.setdefault(tuple(sorted(layout)), []), entry)
        self._refresh(node)

    def mig_gpu(self, node: int, gpu: int) -> MigGpu:
        return MigGpu(self.names[node], gpu, self.model, list(self.layouts[node][gpu]), [], _any_profile)

    def representatives(self, nodes: np.ndarray) -> list[MigGpu]:
        """Per distinct layout, its GPU that wins the engine's ties (lowest node name, then index)
        among the GPUs of ``nodes`` (a boolean mask)."""
        out = []
        for members in self.by_layout.values():
            first = next(((name, g, n) for name, g, n in members if nodes[n]), None)
            if first is not None:
                out.append(self.mig_gpu(first[2], first[1]))
        return out


class DraMigReplay:
    """The MIG DRA pool, one pod at a time (module docstring)."""

    def __init__(self, nodes: Sequence[NodeSpec], model: GpuModel, weights: MostAllocatedWeights,
                 gpu_pods: GpuPods = "engine", tie_rank: Sequence[int] | None = None) -> None:
        if gpu_pods not in GPU_PODS:
            raise ValueError(f"unknown placement of GPU pods {gpu_pods!r}; choose one of {', '.join(GPU_PODS)}")
        ordered = sorted(nodes, key=lambda n: n.name)
        self.model = model
        self.gpu_pods = gpu_pods
        self.weights = weights
        # CPU and memory (and kube-scheduler's scores) on a cluster without GPUs; the GPUs are _Gpus'.
        self.cluster = ClusterState([replace(n, gpu_count=0) for n in ordered], tie_rank=tie_rank)
        self.gpus = _Gpus(model, [n.name for n in ordered], [n.gpu_count for n in ordered])
        self._profile = {name: p for p, name in enumerate(self.gpus.profiles)}

    def place(self, pod: PodSpec) -> list[tuple[str, int, PlacedInstance]] | None:
        """Place ``pod``: per instance its node name, GPU index and placement ([] for a pod without
        GPUs), or None (dropped)."""
        cpu_shape = replace(pod, gpu_count=0, gpu_milli=0, gpu_models=())
        room = self.cluster.feasible(cpu_shape)
        asked = profiles_asked(pod, self.model)
        if not asked:
            nodes_ok = np.flatnonzero(room)
            if nodes_ok.size == 0:
                return None
            self.cluster.place(cpu_shape, scheduler_pick(self.cluster, cpu_shape, nodes_ok, self.weights), ())
            return []
        hosts = room & self.gpus.can_host[:, self._profile[asked[0]]]
        if len(asked) > 1:  # whole GPUs: that many untouched GPUs on one node
            hosts &= self.gpus.empty >= len(asked)
        chosen = self._choose(asked, hosts, cpu_shape)
        if chosen is None:
            return None
        self.cluster.place(cpu_shape, chosen[0][0], ())
        for n, g, instance in chosen:
            self.gpus.add(n, g, instance)
        return [(self.gpus.names[n], g, instance) for n, g, instance in chosen]

    def _choose(self, asked: tuple[str, ...], hosts: np.ndarray,
                cpu_shape: PodSpec) -> list[tuple[int, int, PlacedInstance]] | None:
        """Node, GPU and instance for each profile ``asked``, or None; commits nothing."""
        gpus = self.gpus
        candidates = np.flatnonzero(hosts)
        if candidates.size == 0:
            return None
        if self.gpu_pods == "scheduler":
            node = scheduler_pick(self.cluster, cpu_shape, candidates, self.weights)
            found = first_fit(self.model, gpus.layouts[node], asked)
            return None if found is None else [(node, g, instance) for g, instance in found]
        # place_pod's node rule, over arrays: the best scored of the nodes that can hold the pod.
        c = self.cluster
        scores = node_scores(c.cpu_total[candidates] - c.cpu_free[candidates] + cpu_shape.cpu_milli,
                             c.cpu_total[candidates],
                             c.mem_total[candidates] - c.mem_free[candidates] + cpu_shape.memory_mib,
                             c.mem_total[candidates],
                             gpus.slices_held[candidates] + asked_slices(self.model, asked),
                             gpus.slices_total[candidates])
        best = np.zeros_like(hosts)
        best[candidates[scores == scores.max()]] = True
        if len(asked) == 1:
            pick = choose(gpus.representatives(best), asked[0])
            return None if pick is None else [(gpus.index[pick[0].node], pick[0].index, pick[1])]
        # Whole GPUs only need untouched GPUs, which all rank alike for the engine: its choice is the
        # first best node by name, the GPUs ``place_all`` picks there (it commits to the copies it gets).
        first = int(min(np.flatnonzero(best), key=lambda n: gpus.names[n]))
        picks = place_all([gpus.mig_gpu(first, g) for g in range(len(gpus.layouts[first]))], asked)
        return None if picks is None else [(first, gpu.index, instance) for gpu, instance in picks]


def run_dra_mig(
    nodes: Sequence[NodeSpec],
    trace_pods: Sequence[PodSpec],
    model: GpuModel,
    seed: int,
    weights: MostAllocatedWeights,
    gpu_pods: GpuPods = "engine",
    inflate: float = 1.3,
    max_nodes: int | None = None,
) -> DraMigRun:
    """One seed's run (module docstring)."""
    plan = plan_run(nodes, trace_pods, seed, inflate, max_nodes)
    replay = DraMigReplay(plan.nodes, model, weights, gpu_pods, tie_rank=plan.workload.tie_rank)
    full = full_profile(model)
    count = len(plan.workload.pods)
    arrived = np.zeros(count, dtype=np.int64)
    used = np.zeros(count, dtype=np.int64)
    occupied = np.zeros(count, dtype=np.int64)
    demand = allocated = held = failed = 0
    for i, pod in enumerate(plan.workload.pods):
        demand += pod.gpu_total_milli
        chosen = replay.place(pod)
        if chosen is None:
            failed += 1
        else:
            allocated += pod.gpu_total_milli
            held += sum(GPU_MILLI * model.profile(inst.profile).compute_slices // full.compute_slices
                        for _, _, inst in chosen)
        arrived[i], used[i], occupied[i] = demand, allocated, held
    total = plan.gpus
    return DraMigRun(
        model=model.product, gpu_pods=gpu_pods, seed=seed, pods=count, failed_pods=failed,
        alloc_at=alloc_by_level(arrived, used, total), occupied_at=alloc_by_level(arrived, occupied, total),
        final_alloc_percent=100.0 * allocated / (total * GPU_MILLI),
    )
