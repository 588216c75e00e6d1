"""The controller's snapshot of the cluster: frozen value types, built once per cycle.

The planner is a function of a :class:`Snapshot` and a
time; nothing here talks to Kubernetes. :mod:`controller.state.build` builds these
types from raw API objects (dicts), :mod:`controller.kube` fetches the objects.

Counting rule used everywhere: a MIG instance or a shared replica is *claimed*
by every non-finished gpupack pod bound to its node (``spec.nodeName``) or pinned
there by the controller (required affinity on ``kubernetes.io/hostname``), so a
pod that was released but not yet reported as a user by the node agent still
holds its capacity and is never given away twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from datetime import datetime

from mig.model import GpuModel, PlacedInstance
from sharing.api.backend import DEFAULT_BACKEND, Backend
from sharing.api.crd import labels_match
from sharing.api.gpunode import MigConfigRequest
from sharing.api.kueue_workload import KueueVerdict
from sharing.api.modes import AllocationMode, NodeSharingMode
from sharing.api.priority import PodPriority
from sharing.rules.replicas import Ask, fits_split
from sharing.rules.node_policy import NodePolicy
from sharing.rules.taints import Taint, Toleration

MIB = 2**20
"""Bytes in a MiB: GPU memory is reported in MiB, and the replica rule takes bytes."""


@dataclass(frozen=True)
class Gpu:
    """One GPU as the node agent reports it, plus the controller's idle record."""

    index: int
    memory_mib: int
    mig_enabled: bool
    instances: tuple[PlacedInstance, ...] = ()
    in_use: tuple[PlacedInstance, ...] = ()
    """Instances the agent reports in use (a subset of ``instances``)."""
    idle_since: datetime | None = None
    """Since when no instance (or the whole GPU) has been in use; None = busy or unknown."""
    utilization_percent: int | None = None
    reshaping: bool = False
    """The spec asks for a different geometry than the status shows and the agent has
    not refused or given up on it: a reshape in flight (it holds a ``maxConcurrent`` slot)."""
    desired: tuple[str, ...] | None = None
    """Profiles ``GPUNode.spec`` asks for (sorted), when it names a layout."""
    healthy: bool = True
    """The GPU has no fault (``GPUStatus.health``, ``node.health``)."""
    unhealthy_instances: tuple[PlacedInstance, ...] = ()
    """Instances with a fault of their own."""
    users: tuple[tuple[PlacedInstance, tuple[str, ...]], ...] = ()
    """The instances the agent names pods on, with those pods (``namespace/name``): who holds which
    instance, which a preemption that reshapes the GPU needs (``controller.planning.mig_preemption``)."""

    @property
    def profiles(self) -> Counter[str]:
        return Counter(i.profile for i in self.instances)

    @property
    def faulted(self) -> bool:
        """The GPU or one of its instances has a fault: never reshaped, shared or switched."""
        return not self.healthy or bool(self.unhealthy_instances)

    @cached_property
    def offered(self) -> Counter[str]:
        """Profiles of the instances that count as capacity: the healthy ones on a healthy GPU.

        A faulted instance still in use counts nowhere although its pod's claim still counts:
        that is how kube-scheduler sees it too (the device plugin takes the device out of
        allocatable while the pod's request stays), so the free count here is the one the
        scheduler will find, and a released pod is never left Unschedulable. Computed once per
        GPU (a GPU reading outlives cycles, ``controller.state.incremental``): never change it."""
        return Counter(i.profile for i in self.instances if self.healthy and i not in self.unhealthy_instances)


@dataclass(frozen=True)
class Node:
    """A GPU node: its GPUNode (spec and status) and the Node labels policies select on."""

    name: str
    product: str
    model: GpuModel | None
    labels: tuple[tuple[str, str], ...]
    sharing: NodeSharingMode
    replicas: int
    gpus: tuple[Gpu, ...]
    cpu_milli: int = 0
    memory_mib: int = 0
    spec_sharing: NodeSharingMode = "none"
    spec_replicas: int = 1
    """What the controller last asked for (the status may lag behind)."""
    generation: int = 0
    observed_generation: int = 0
    whole_taken: int = 0
    """``nvidia.com/gpu`` requested by the pods bound to the node, gpupack's or not."""
    cpu_used_milli: int = 0
    memory_used_mib: int = 0
    """CPU and memory requested by the pods bound to the node, gpupack's or not, and by gpupack's
    pods pinned there and not bound yet: what kube-scheduler will count as taken."""
    silent_seconds: float | None = None
    """How long ago its agent last wrote the status (``status.heartbeatTime``); None: unknown."""
    stale: bool = False
    """Silent longer than the controller's ``agent_stale_seconds``: the planner leaves it out."""
    degraded: bool = False
    """A GPU fault the device plugin keeps advertising (``sharing.api.gpunode``): the planner leaves it out."""
    taints: tuple[Taint, ...] = ()
    """The Node's ``NoSchedule`` and ``NoExecute`` taints (``sharing.rules.taints``)."""

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)

    @property
    def full_gpus(self) -> tuple[Gpu, ...]:
        """Healthy GPUs with MIG off: what whole-GPU and shared capacity is counted on."""
        return tuple(g for g in self.gpus if not g.mig_enabled and g.healthy)

    @property
    def faulted(self) -> bool:
        return any(g.faulted for g in self.gpus)

    @cached_property
    def gpu_memory_bytes(self) -> int:
        """The memory the replica rule judges a shared pod by here: its largest GPU's (0: no GPU)."""
        return max((g.memory_mib for g in self.gpus), default=0) * MIB

    @property
    def room(self) -> tuple[int, int] | None:
        """Allocatable CPU milli and memory MiB not requested by its pods; None when the allocatable
        is unknown (then CPU and memory never limit where a pod goes)."""
        if not self.cpu_milli or not self.memory_mib:
            return None
        return self.cpu_milli - self.cpu_used_milli, self.memory_mib - self.memory_used_mib

    @property
    def converged(self) -> bool:
        return self.observed_generation >= self.generation and not any(g.reshaping for g in self.gpus)


@dataclass(frozen=True)
class Pod:
    """A gpupack pod, as its ``gpupack.io/allocation`` annotation and spec describe it."""

    namespace: str
    name: str
    mode: AllocationMode
    created: datetime
    profiles: tuple[str, ...] = ()
    """MIG: one profile per GPU container."""
    milli: tuple[int, ...] = ()
    memory_bytes: tuple[int | None, ...] = ()
    products: tuple[str, ...] = ()
    """GPU products the webhook's affinity allows (empty: any)."""
    replicas: int | None = None
    """Shared modes: the replica count the webhook's affinity requires (None: any that fits)."""
    gated: bool = False
    queue_held: bool = False
    """Still carries Kueue's admission gate (``sharing.api.keys.KUEUE_ADMISSION_GATE``): its ClusterQueue
    has not admitted it, so it is no demand; the planner reports it and plans nothing for it."""
    unschedulable: bool = False
    """Not gated, not bound, and kube-scheduler reported it Unschedulable: capacity it was
    admitted for is gone (another pod took it), so it is demand for new capacity too."""
    node: str | None = None
    """Bound (``spec.nodeName``) or pinned (hostname affinity) node."""
    bound: bool = False
    cpu_milli: int = 0
    memory_mib: int = 0
    uid: str = ""
    node_selector: tuple[tuple[str, str], ...] = ()
    terms: tuple[tuple[tuple[str, str, tuple[str, ...]], ...], ...] = ()
    """Required node affinity: terms ORed, each a tuple of (key, operator, values) ANDed."""
    backend: Backend = DEFAULT_BACKEND
    """``dra``: placed by ``controller.planning.draplan`` on the DRA node pool, never by ``controller.planning.planner``."""
    claim: str | None = None
    """DRA backend: the ResourceClaim the pod references (created by the controller when it places the pod)."""
    requests: tuple[str, ...] = ()
    """DRA backend: each GPU container's request in that claim (``gpu-<n>``), in record order."""
    mig_fallback: tuple[str, ...] = ()
    """DRA backend, a shared pod decided for ``auto``: per container the MIG profile the engine may
    place it on when no shared GPU has room (``Allocation.mig_fallback``; empty: none)."""
    priority: PodPriority = PodPriority()
    """``spec.priority`` and ``spec.preemptionPolicy`` (``sharing.api.priority.pod_priority``); a pod whose
    fields that reader refuses reads as priority 0 with ``Never``: it never preempts on a guess."""
    priority_problem: str | None = None
    """Why the pod's priority fields were refused (None: they were read)."""
    victims: tuple[str, ...] = ()
    """A preemptor: the uids of the pods the controller preempted for it (``gpupack.io/preempting``);
    while any of them exists it waits on its pinned node and never preempts again."""
    tolerations: tuple[Toleration, ...] = ()
    """``spec.tolerations`` (``sharing.rules.taints``): the planner pins the pod only to a node whose
    taints it tolerates."""
    plain: bool = False
    """Not gpupack's: a pod asking ``nvidia.com/gpu`` itself that kube-scheduler left Unschedulable
    (``controller.state.pods.plain_preemptor``). kube-scheduler places it; the planner only preempts
    and switches a node back to whole GPUs for it. ``node`` is the node its preemption freed."""

    def admits(self, labels: dict[str, str]) -> bool:
        """Whether the pod's nodeSelector and required node affinity allow a node with ``labels``."""
        if not labels_match(dict(self.node_selector), labels):
            return False
        return not self.terms or any(all(_matches(e, labels) for e in term) for term in self.terms)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def shares(self) -> int:
        """Shared replicas the pod takes (one per GPU container)."""
        return len(self.milli) if self.mode in ("mps", "time-slicing") else 0

    @property
    def whole_gpus(self) -> int:
        """Whole GPUs the pod takes (mode ``whole``: one per GPU container)."""
        return len(self.milli) if self.mode == "whole" else 0

    @cached_property
    def asks(self) -> tuple[Ask, ...]:
        """Each GPU container's compute milli and memory bytes (None: not asked), as ``sharing.rules.replicas`` takes them."""
        return tuple(zip(self.milli, self.memory_bytes))

    def fits_replicas(self, replicas: int, gpu_memory_mib: int) -> bool:
        """The webhook's rule (``sharing.rules.replicas``) for every GPU container of the pod."""
        return fits_split(replicas, self.asks, gpu_memory_mib * MIB)


def _matches(expression: tuple[str, str, tuple[str, ...]], labels: dict[str, str]) -> bool:
    key, op, values = expression
    value = labels.get(key)
    if op == "In":
        return value in values
    if op == "NotIn":
        return value not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and value is not None and value.lstrip("-").isdigit() and values and values[0].lstrip("-").isdigit():
        return int(value) > int(values[0]) if op == "Gt" else int(value) < int(values[0])
    return False


@dataclass(frozen=True)
class PlainGpuPod:
    """A pod that asks ``nvidia.com/gpu`` itself (not gpupack's), placed or waiting: kube-scheduler
    places it, and the packing engine counts it among the GPU pods that exist (its typical pods)."""

    key: str
    gpus: int
    cpu_milli: int = 0
    memory_mib: int = 0
    products: tuple[str, ...] = ()
    """GPU products its required affinity allows (empty: any)."""
    node: str | None = None
    """The node it is bound to (None: waiting): a GPU pod there for the placement preference by priority."""
    priority: int = 0
    """``spec.priority`` (``sharing.api.priority.priority_of``)."""
    preemptor: Pod | None = None
    """The planner's view of it while it waits Unschedulable (``controller.state.pods.plain_preemptor``):
    gpupack may preempt for it; None otherwise."""


@dataclass(frozen=True)
class FailedDevice:
    """A GPU or MIG instance with a fault, and the pods that used it when it failed (``GPUStatus.health``)."""

    node: str
    where: str
    """For people: ``GPU 0`` or ``MIG instance 3g.40gb@4 of GPU 0``."""
    reason: str
    message: str
    pods: tuple[str, ...]
    """``namespace/name``."""


@dataclass(frozen=True)
class Snapshot:
    """Everything one planning cycle reads."""

    nodes: tuple[Node, ...]
    pods: tuple[Pod, ...]
    policies: dict[str, NodePolicy] = field(default_factory=dict)
    """Node name -> merged policy; nodes absent here are never reshaped (opt-in)."""
    whole_waiting: int = 0
    """``nvidia.com/gpu`` asked by pending pods that are not gpupack's and that kube-scheduler
    found no node for: demand for idle shared nodes to return to whole-GPU use."""
    skipped_entries: tuple[str, ...] = ()
    """GPUNode status entries the reader (``sharing.api.gpunode``) left out as unreadable."""
    untrusted_pods: tuple[str, ...] = ()
    """``namespace/name: why`` of pods whose allocation annotation was ignored (unreadable, or
    not what the pod requests): they are not planned for, released or counted."""
    mig_config_requests: tuple[tuple[str, MigConfigRequest], ...] = ()
    """``(node, request)`` for each operator-mode agent waiting for its mig-parted config to be
    published into mig-manager's ConfigMap (``controller.writes.mig_configs``)."""
    plain_gpu_pods: tuple[PlainGpuPod, ...] = ()
    """Pods asking ``nvidia.com/gpu`` themselves, not finished (:class:`PlainGpuPod`)."""
    failed_devices: tuple[FailedDevice, ...] = ()
    """Every faulted GPU and MIG instance, for the opt-in eviction of their pods (``controller.planning.evictions``)."""
    present: frozenset[str] = frozenset()
    """The uids of every pod listed, terminating ones too: a preemptor waits while one of its
    :attr:`Pod.victims` is still here (``controller.planning.preemption``)."""
    kueue: Mapping[str, KueueVerdict] = field(default_factory=dict)
    """Kueue's verdict on each pod it holds, by pod ``uid`` (``sharing.api.kueue_workload``): read only
    while some pod carries Kueue's admission gate (``controller.state.kueue``)."""
    kueue_read: bool = False
    """Kueue's Workloads were read this cycle (False: none was needed, the API is not served, or the
    read failed): a held pod without a verdict then says so (``held_message``)."""

    def node(self, name: str) -> Node | None:
        return next((n for n in self.nodes if n.name == name), None)
