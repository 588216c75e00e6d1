"""A pure, precomputed view of the cluster's GPUs and sharing policies.

Built from the raw ``GPUNode`` and ``SharingPolicy`` objects (dicts, as the
API server or a YAML file gives them) once per change, never per request: the
webhook swaps in a new :class:`Inventory` when a watch event changes what it
holds (``sharing.admission.inventory_parts`` keeps it one object at a time) and reads the
current one on the request path without any API call or lock.

What a GPUNode reports (group ``gpupack.io/v1alpha1``): ``status.gpus[]`` with
product, memory, whether MIG is on and the MIG instances (profile, start,
``inUse``), and ``status.sharing`` (or, until the agent reports, ``spec.sharing``)
saying whether the node's device plugin shares full GPUs by MPS or
time-slicing, and into how many replicas. Unknown or malformed entries are
skipped, not fatal: one bad object must not take the front door down.

Each node belongs to one backend's pool (``sharing.api.backend``): the ``Node``
objects among the inputs carry the pool label, and a GPUNode whose Node is not
among them (or has no label) is in the device plugin's pool.
:meth:`Inventory.pool` is the snapshot of one pool's nodes, which is what a pod
bound for that pool is decided against.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from mig.model import GpuModel
from sharing.api.backend import DEFAULT_BACKEND, Backend, node_backend
from sharing.api.crd import PolicyEntry, SharingPolicySpec, read_policies
from sharing.api.gpunode import GpuNodeReading, GpuReading, read_gpunode
from sharing.admission.inventory_index import NodeIndex
from sharing.api.modes import MODES, Mode, NodeSharingMode


@dataclass(frozen=True)
class NodeView:
    """One GPU node: its product, MIG-capable model (if any), sharing and GPUs."""

    name: str
    product: str
    model: GpuModel | None
    sharing: NodeSharingMode
    replicas: int
    gpus: tuple[GpuReading, ...]
    """As the one GPUNode reader reads them (``sharing.api.gpunode``), less what admission never
    reads: the utilisation sample and the layout refusal (both None here). Every agent's
    heartbeat moves the sample; a view without it stays equal, so a heartbeat publishes no new
    snapshot (``sharing.admission.inventory_parts``)."""
    shared_in_use: int = 0
    """Shared replicas already handed out, when the agent reports it (0 if unknown)."""
    degraded: bool = False
    """A GPU fault the device plugin keeps advertising: no new pod goes here, nothing is free."""
    backend: Backend = DEFAULT_BACKEND
    """The node pool it belongs to (its Node's ``gpupack.io/backend`` label)."""

    # What decisions read of a node, worked out once per node: a view kept by watches
    # (``sharing.admission.inventory_parts``) carries an unchanged node's view, and these with it,
    # into the next snapshot.

    @cached_property
    def gpu_memory_mib(self) -> int:
        return max((g.memory_mib for g in self.gpus), default=self.model.memory_mib if self.model else 0)

    @cached_property
    def full_gpus(self) -> int:
        """GPUs not in MIG mode."""
        return sum(1 for g in self.gpus if not g.mig_enabled)

    @cached_property
    def free_by_profile(self) -> tuple[tuple[str, int], ...]:
        """Unused healthy MIG instances per profile (sorted by profile) on healthy MIG-enabled GPUs
        of this node; none on a degraded node."""
        if self.degraded:
            return ()
        return tuple(sorted(Counter(i.profile for g in self.gpus if g.mig_enabled and g.healthy
                                    for i in g.instances if not i.in_use and i.healthy).items()))

    def free_instances(self, profile: str) -> int:
        """Unused healthy MIG instances of ``profile`` (:attr:`free_by_profile`)."""
        return next((n for p, n in self.free_by_profile if p == profile), 0)

    @cached_property
    def mig_room(self) -> bool:
        """The node could hold a new MIG instance created for a claim (the DRA pool's MIG capacity)."""
        return not self.degraded and any(g.mig_enabled and g.healthy for g in self.gpus)

    @cached_property
    def shared_room(self) -> bool:
        """The node could hand out a shared replica once one is free: it shares its GPUs, is not
        degraded, and has a healthy GPU not in MIG mode. A node without is no capacity an ``auto``
        pod should wait for (``sharing.admission.options``, ``Option.can_come``)."""
        return (self.sharing in ("mps", "time-slicing") and self.replicas >= 1 and not self.degraded
                and any(not g.mig_enabled and g.healthy for g in self.gpus))

    @cached_property
    def shared_free(self) -> int:
        """Shared replicas not yet handed out on healthy GPUs (all of them when usage is not reported)."""
        if self.degraded:
            return 0
        full_gpus = sum(1 for g in self.gpus if not g.mig_enabled and g.healthy)
        return max(0, full_gpus * self.replicas - self.shared_in_use)


@dataclass(frozen=True)
class AdmissionPolicy:
    """What the webhook enforces for one namespace (merged from every SharingPolicy)."""

    name: str
    """The SharingPolicy (or policies, comma-joined) this comes from; ``(none)`` if none."""
    allowed_modes: tuple[Mode, ...] = MODES
    allowed_profiles: tuple[str, ...] = ()
    """MIG profiles pods may get; empty = any."""
    default_memory_bytes: int | None = None

    def allows_profile(self, name: str) -> bool:
        return not self.allowed_profiles or name in self.allowed_profiles


DEFAULT_POLICY = AdmissionPolicy(name="(none)")


def admission_policy(policies: Sequence[tuple[str, SharingPolicySpec]], namespace: str,
                     labels: Mapping[str, str] | None) -> AdmissionPolicy:
    """The merged policy for ``namespace`` (``labels``: its labels, None when unknown), from the
    valid SharingPolicies by name: the one reading the webhook decides with and the controller
    checks allocation records against (``sharing.admission.record_policy``).

    Several SharingPolicies may exist (each for its own nodes); a namespace
    may use a mode if any of them allows it there, and a MIG profile if any
    allows it. The webhook does not know which policy's nodes a pod will
    land on, so it enforces the union and leaves the node choice to the
    affinity and the controller.
    """
    if not policies:
        return DEFAULT_POLICY
    specs = [spec for _, spec in policies]
    modes = {m for spec in specs for m in spec.modes_for(namespace, labels)}
    profiles: tuple[str, ...] = ()
    if all(spec.allowed_profiles is not None for spec in specs):
        profiles = tuple(sorted({x for spec in specs for x in spec.allowed_profiles or ()}))
    memory = next((spec.default_gpu_memory_bytes for spec in specs if spec.default_gpu_memory_bytes), None)
    return AdmissionPolicy(
        name=",".join(name for name, _ in policies),
        allowed_modes=tuple(m for m in MODES if m in modes),
        allowed_profiles=profiles,
        default_memory_bytes=memory,
    )


@dataclass(frozen=True)
class Inventory:
    """Immutable snapshot; ``version`` changes whenever the content does."""

    nodes: tuple[NodeView, ...] = ()
    policies: tuple[tuple[str, SharingPolicySpec], ...] = ()
    """Valid SharingPolicies by name (``sharing.api.crd.read_policies``, the reading every component shares)."""
    namespace_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    synced: bool = True
    version: int = 0
    skipped_policies: tuple[str, ...] = ()
    """One line per SharingPolicy left out because its spec does not validate."""
    skipped_entries: tuple[str, ...] = ()
    """One line per GPUNode status entry left out (``sharing.api.gpunode``)."""

    def policy_for(self, namespace: str) -> AdmissionPolicy:
        """The merged policy for ``namespace`` (:func:`admission_policy` of this snapshot's policies)."""
        return admission_policy(self.policies, namespace, self.namespace_labels.get(namespace))

    @cached_property
    def max_gpu_memory_mib(self) -> int:
        return max((n.gpu_memory_mib for n in self.nodes), default=0)

    @cached_property
    def index(self) -> NodeIndex:
        """The nodes grouped for the decision's questions (``sharing.admission.inventory_index``), once per snapshot."""
        return NodeIndex(self.nodes)

    def prepare(self) -> Inventory:
        """Work out now what the decisions read of every pool (the pools, their largest GPU, MIG models
        and index), so that the first decision against a new snapshot does not; itself."""
        for backend in ("device-plugin", "dra"):
            pool = self.pool(backend)
            _ = pool.max_gpu_memory_mib, pool.mig_models, pool.index
        return self

    @cached_property
    def mig_models(self) -> tuple[GpuModel, ...]:
        """MIG-capable models present in the cluster, in a stable order."""
        seen: dict[str, GpuModel] = {}
        for node in self.nodes:
            if node.model is not None:
                seen.setdefault(node.model.product, node.model)
        return tuple(seen[k] for k in sorted(seen))

    def pool(self, backend: Backend) -> Inventory:
        """This snapshot with only ``backend``'s nodes (itself when every node is of that pool).

        Remembered per backend, so a pool's own cached views (largest GPU, MIG models) are
        worked out once per snapshot, like the whole snapshot's."""
        return self._pools[backend]

    @cached_property
    def _pools(self) -> dict[Backend, Inventory]:
        pools: dict[Backend, Inventory] = {}
        for backend in ("device-plugin", "dra"):
            nodes = tuple(n for n in self.nodes if n.backend == backend)
            pools[backend] = self if len(nodes) == len(self.nodes) else replace(self, nodes=nodes)
        return pools


# --- building from raw objects ------------------------------------------------


def node_from_object(obj: Mapping[str, Any]) -> NodeView | None:
    """A :class:`NodeView` from a ``GPUNode`` dict (``sharing.api.gpunode``, the controller's reading
    too); ``None`` if it has no name."""
    reading = read_gpunode(obj)
    return None if reading is None else node_view(reading)


def node_view(reading: GpuNodeReading, backend: Backend = DEFAULT_BACKEND) -> NodeView:
    """The webhook's view of one read GPUNode, in ``backend``'s pool."""
    sharing = reading.sharing
    return NodeView(
        name=reading.name,
        product=reading.product,
        model=reading.model,
        sharing=sharing.mode,
        replicas=sharing.replicas if sharing.mode != "none" else 0,
        gpus=tuple(_admission_gpu(g) for g in reading.gpus),
        shared_in_use=sharing.in_use,
        degraded=reading.degraded,
        backend=backend,
    )


def _admission_gpu(gpu: GpuReading) -> GpuReading:
    """``gpu`` without what admission never reads (see :attr:`NodeView.gpus`)."""
    if gpu.gpu_percent is None and gpu.layout_refusal is None:
        return gpu
    return replace(gpu, gpu_percent=None, layout_refusal=None)


def build_inventory(objects: Iterable[Mapping[str, Any]], *, synced: bool = True, version: int = 0) -> Inventory:
    """An :class:`Inventory` from a mix of ``GPUNode``, ``SharingPolicy``, ``Namespace`` and ``Node`` dicts.

    An object without ``kind`` is taken as a GPUNode (the ``--inventory`` file
    is documented as a list of GPUNodes). A ``Node`` contributes only its labels:
    the pool of the GPUNode of the same name. ``skipped_entries`` come in the nodes'
    order (by name), whatever the order of ``objects``.

    This reads every object: a view kept by watches applies each change with
    ``sharing.admission.inventory_parts.InventoryParts`` instead, which assembles the same snapshot.
    """
    readings: list[GpuNodeReading] = []
    node_labels: dict[str, Mapping[str, str]] = {}
    policy_objects: list[Mapping[str, Any]] = []
    namespaces: dict[str, Mapping[str, str]] = {}
    for obj in objects:
        if not isinstance(obj, Mapping):
            continue
        kind = obj.get("kind", "GPUNode")
        if kind == "GPUNode":
            reading = read_gpunode(obj)
            if reading is not None:
                readings.append(reading)
        elif kind == "Node":
            name, labels = name_and_labels(obj)
            if name is not None:
                node_labels[name] = labels
        elif kind == "SharingPolicy":
            policy_objects.append(obj)
        elif kind == "Namespace":
            name, labels = name_and_labels(obj)
            if name is not None:
                namespaces[name] = labels
    readings.sort(key=lambda r: r.name)
    nodes = [node_view(r, node_backend(node_labels.get(r.name))) for r in readings]
    skipped = [line for r in readings for line in r.skipped]
    policies, skipped_policies = policy_fields(read_policies(policy_objects))
    return Inventory(
        nodes=tuple(nodes),
        policies=policies,
        namespace_labels=namespaces,
        synced=synced,
        version=version,
        skipped_policies=skipped_policies,
        skipped_entries=tuple(skipped),
    )


def policy_fields(entries: Iterable[PolicyEntry]) -> tuple[tuple[tuple[str, SharingPolicySpec], ...], tuple[str, ...]]:
    """:attr:`Inventory.policies` and :attr:`Inventory.skipped_policies` from read policies (by name)."""
    entries = list(entries)
    return (tuple((p.name, p.spec) for p in entries if p.spec is not None),
            tuple(f"SharingPolicy {p.name}: {p.problem}" for p in entries if p.spec is None))


def name_and_labels(obj: Mapping[str, Any]) -> tuple[str | None, Mapping[str, str]]:
    """A Node's or Namespace's name (None when it has none) and labels (strings)."""
    metadata = obj.get("metadata") or {}
    if not isinstance(metadata, Mapping) or not isinstance(metadata.get("name"), str):
        return None, {}
    labels = metadata.get("labels") or {}
    return metadata["name"], {str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {}
