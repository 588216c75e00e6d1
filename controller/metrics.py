"""Prometheus metrics of the controller, and the cluster figures they report (pure helpers).

Allocation ratio: allocated GPU capacity over all GPUs — a MIG instance a pod
holds counts its compute slices over the GPU's, a taken shared replica counts
``1/r`` of its GPU; on the DRA pool, what its ResourceClaims hold (a share its
milli over 1000, a MIG placement its compute slices, a whole GPU all of it).
Fragmentation: the share of *free* capacity that sits on
partly allocated GPUs (free, but not usable by a whole-GPU or large request).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter as PromCounter, Gauge, Histogram

from controller.state.claims import mig_claims, shared_claims, whole_pinned
from controller.state.dra_usage import Hold
from controller.state.snapshot import Node, Snapshot
from sharing.api.backend import node_backend
from sharing.packing.specs import GPU_MILLI


def _held(node: Node, device_holds: Sequence[Hold]) -> float:
    """The fraction of one GPU of a DRA node that claims hold (``device_holds``: that GPU's)."""
    used = 0.0
    for hold in device_holds:
        d = hold.device
        if d.kind == "shared":
            used += d.milli / GPU_MILLI
        elif d.kind == "mig" and d.profile and node.model is not None:
            used += node.model.profile(d.profile).compute_slices / node.model.compute_slices
        else:
            used += 1.0
    return used


def cluster_figures(snapshot: Snapshot, dra_holds: Sequence[Hold] = ()) -> tuple[float, float, int]:
    """(allocation ratio, fragmentation, GPUs) of the snapshot; ``dra_holds``: what the DRA pool's
    claims hold (``controller.state.dra_usage``), the one record of which device a DRA pod uses."""
    held_on: defaultdict[tuple[str, int], list[Hold]] = defaultdict(list)
    for hold in dra_holds:
        held_on[hold.node, hold.device.gpu].append(hold)
    claims = mig_claims(snapshot.pods)
    shared = shared_claims(snapshot.pods)
    pinned = whole_pinned(snapshot.pods)
    used_total = free_total = free_on_partial = 0.0
    gpus = 0
    for node in snapshot.nodes:
        busy: Counter[str] = Counter(claims.get(node.name, Counter()))
        for p, n in Counter(i.profile for g in node.gpus for i in g.in_use).items():
            busy[p] = max(busy[p], n)
        shared_left = shared[node.name]
        # Whole GPUs held by pods (any pod's nvidia.com/gpu, and gpupack's pinned ones);
        # which device each holds is the device plugin's business: count them in order.
        whole_left = node.whole_taken + pinned[node.name]
        dra = node_backend(node.label_map) == "dra"
        for g in node.gpus:
            gpus += 1
            if dra:
                used = _held(node, held_on.get((node.name, g.index), ()))
            elif g.mig_enabled and node.model is not None:
                used = 0.0
                for inst in g.instances:
                    if busy[inst.profile] > 0:
                        busy[inst.profile] -= 1
                        used += node.model.profile(inst.profile).compute_slices / node.model.compute_slices
            elif node.sharing != "none":
                on_gpu = min(shared_left, node.replicas)
                shared_left -= on_gpu
                used = on_gpu / node.replicas
            elif whole_left > 0:
                whole_left -= 1
                used = 1.0
            else:
                used = 1.0 if (g.utilization_percent or 0) > 0 else 0.0
            used = min(1.0, used)
            used_total += used
            free_total += 1.0 - used
            if 0.0 < used < 1.0:
                free_on_partial += 1.0 - used
    ratio = used_total / gpus if gpus else 0.0
    frag = free_on_partial / free_total if free_total else 0.0
    return ratio, frag, gpus


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.allocation_ratio = Gauge("gpupack_cluster_allocation_ratio", "Allocated share of all GPUs (0..1).", registry=r)
        self.fragmentation = Gauge("gpupack_cluster_fragmentation", "Share of free GPU capacity on partly used GPUs.", registry=r)
        self.gpus = Gauge("gpupack_cluster_gpus", "GPUs known from GPUNodes.", registry=r)
        self.skipped_entries = Gauge(
            "gpupack_gpunode_skipped_entries", "GPUNode status entries (GPUs, MIG instances) left out as unreadable.",
            registry=r,
        )
        self.stale_gpunodes = Gauge(
            "gpupack_stale_gpunodes", "GPUNodes whose agent has been silent longer than agent_stale_seconds.",
            registry=r,
        )
        self.untrusted_allocations = Gauge(
            "gpupack_untrusted_allocations",
            "Pods whose gpupack.io/allocation annotation is ignored: unreadable, or not what the pod requests.",
            registry=r,
        )
        self.faulted_devices = Gauge(
            "gpupack_controller_faulted_devices",
            "GPUs and MIG instances with a fault the last planning cycle left out, by node.", ["node"], registry=r,
        )
        self.degraded_node = Gauge(
            "gpupack_controller_degraded_node",
            "1 while the planner leaves the node out for a fault the device plugin keeps advertising.", ["node"],
            registry=r,
        )
        self.pending = Gauge("gpupack_pending_fractional_pods", "Pods waiting at the gpupack.io/capacity gate.", registry=r)
        self.oldest_wait = Gauge("gpupack_pending_oldest_wait_seconds", "Age of the oldest gated pod.", registry=r)
        self.wait = Histogram(
            "gpupack_pod_gate_wait_seconds", "Pod creation to gate lifted.",
            buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800), registry=r,
        )
        self.releases = PromCounter("gpupack_gate_releases", "Gates lifted (pods pinned and released).", registry=r)
        self.reshapes = PromCounter("gpupack_gpu_reshapes", "GPU layout changes written.", ["kind"], registry=r)
        self.evictions = PromCounter("gpupack_gpu_fault_evictions", "Pods evicted from failed GPUs or MIG instances "
                                     "(--evict-on-gpu-fault).", registry=r)
        self.right_size_evictions = PromCounter(
            "gpupack_right_size_evictions", "Pods evicted to be recreated at their recommended size (Recreate), by "
            "reason: at-risk (memory limit below the recommendation) or far (sharing.usage.updater).", ["reason"],
            registry=r)
        self.right_size_rollouts = PromCounter(
            "gpupack_right_size_rollouts", "Deployments rolled out to resize their only replica make-before-break "
            "(Recreate), by reason: at-risk or far.", ["reason"], registry=r)
        self.evictions_blocked = PromCounter(
            "gpupack_evictions_blocked", "Evictions a PodDisruptionBudget refused (429; the pod stays, retried next "
            "cycle), by what asked: gpu-fault or right-size.", ["cause"], registry=r)
        self.preemptions = PromCounter(
            "gpupack_preemptions", "Pods preempted for a waiting pod of higher priority that fitted nowhere "
            "(controller.planning.preemption), by what was freed: replica, whole-gpus (sharing.packing.preemption's "
            "reasons, reshape among them), mig-instance or mig-reshape.",
            ["reason"], registry=r)
        self.sharing_changes = PromCounter("gpupack_node_sharing_changes", "Node sharing changes written.", ["reason"], registry=r)
        self.reconcile_errors = PromCounter("gpupack_controller_reconcile_errors", "Failed API writes or cycles.", ["stage"], registry=r)
        self.cycles = Histogram(
            "gpupack_controller_cycle_seconds", "Duration of one planning cycle.",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10), registry=r,
        )
        self.leader = Gauge("gpupack_controller_leader", "1 while this replica holds the lease.", registry=r)
        self.cycle_triggers = PromCounter(
            "gpupack_controller_cycle_triggers", "Cycles run, by what started them: a change in the watch caches "
            "(change) or the resync interval without one (resync).", ["trigger"], registry=r)
        self.reread = Gauge("gpupack_controller_snapshot_reread_objects", "Objects the last cycle read afresh because "
                            "they changed (the rest came from the snapshot cache).", ["kind"], registry=r)
        self.cached = Gauge("gpupack_controller_cached_objects", "Objects held in the watch caches.", ["kind"], registry=r)
        self.rejected = Gauge("gpupack_controller_rejected_objects", "Objects the watch caches left out as unreadable "
                              "(nested deeper than any reader survives); their names are logged.", ["kind"], registry=r)
        self.recommendation_writes = PromCounter(
            "gpupack_recommendations_written", "GPURecommendation objects created or their status written.",
            ["kind"], registry=r)
        self.recommended_workloads = Gauge(
            "gpupack_recommender_workloads", "Workload containers the recommender tracks, by whether they "
            "have a recommendation yet.", ["state"], registry=r)
        self.unattributed_pods = Gauge(
            "gpupack_recommender_unattributed_pods", "Pods whose published use is unattributed (never sized).",
            registry=r)
        self.recommender_seconds = Histogram(
            "gpupack_recommender_cycle_seconds", "Duration of one recommender cycle.", registry=r)
