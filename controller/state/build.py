"""Building a :class:`~controller.state.snapshot.Snapshot` from raw API objects (dicts), purely.

Lenient by design, like the webhook's inventory: one malformed GPUNode or pod
is skipped (and counted), never fatal to the cycle. The only state the
controller keeps between cycles lives on the GPUNode itself, in the
``gpupack.io/idle-since`` annotation (GPU index -> RFC 3339 time), so that a
restarted or newly elected controller honours ``idleSeconds`` exactly as the
previous one would have.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from controller.state.claims import mig_claims, shared_claims
from controller.state.pods import (
    plain_preemptor, pod_from_object, priority_of, read_record, required_products, resources_held, waiting_unschedulable,
    whole_gpus_requested,
)
from controller.state.snapshot import FailedDevice, Gpu, Node, PlainGpuPod, Pod, Snapshot
from kube.times import format_time, parse_time, seconds_since
from mig.model import PlacedInstance, Placement
from mig.units import parse_quantity
from sharing.api.allocation import Allocation
from sharing.api.crd import read_policies
from sharing.api.gpunode import GpuNodeReading, read_gpunode
from sharing.admission.inventory import AdmissionPolicy, admission_policy, name_and_labels
from sharing.api.keys import ALLOCATION_ANNOTATION, IDLE_SINCE_ANNOTATION
from sharing.api.fields import as_int as _int
from sharing.api.fields import as_list as _list
from sharing.api.fields import as_map as _map
from sharing.rules.node_policy import NodePolicy, policies_for_nodes
from sharing.admission.record_policy import record_problem
from sharing.rules.taints import read_taints

__all__ = [
    "NodeParse", "PodParse", "SnapshotReader", "assemble", "build_snapshot", "busy_by_node", "busy_gpus", "encode_idle", "format_time",
    "idle_record", "merge_policies", "namespace_policies", "node_from_objects", "object_meta", "parse_node", "parse_pod", "parse_time", "pod_from_object",
    "refused_gpus", "scoped", "update_idle",
]





def idle_record(gpunode: Mapping[str, Any]) -> dict[int, datetime]:
    raw = _map(_map(gpunode.get("metadata")).get("annotations")).get(IDLE_SINCE_ANNOTATION)
    try:
        data = json.loads(raw) if isinstance(raw, str) else {}
    except (json.JSONDecodeError, RecursionError):  # RecursionError: nested thousands deep
        return {}
    out: dict[int, datetime] = {}
    for key, value in _map(data).items():
        when = parse_time(value)
        if str(key).isdigit() and when is not None:
            out[int(key)] = when
    return out


def update_idle(previous: Mapping[int, datetime], busy: Mapping[int, bool], now: datetime) -> dict[int, datetime]:
    """Idle GPUs keep their first idle time (or start now); busy ones leave the record."""
    return {i: previous.get(i, now) for i, b in sorted(busy.items()) if not b}


def encode_idle(record: Mapping[int, datetime]) -> str:
    return json.dumps({str(i): format_time(t) for i, t in sorted(record.items())}, separators=(",", ":"))


# --------------------------------------------------------------------- nodes


def _reshaping(want: Mapping[str, Any], mig_enabled: bool, instances: tuple[PlacedInstance, ...]) -> bool:
    if not want:
        return False
    if bool(want.get("migEnabled")) != mig_enabled:
        return True
    layout = want.get("layout")
    if not isinstance(layout, list):
        return False
    # Profiles only: the agent chooses placements (it keeps in-use instances where they are).
    return sorted(str(_map(i).get("profile")) for i in layout) != sorted(i.profile for i in instances)


def refused_gpus(gpunode: Mapping[str, Any]) -> frozenset[int]:
    """GPUs whose requested layout the agent gave up on, for the current spec.

    Such a GPU is not "reshaping": its spec still differs from its status, but no
    reshape is in flight, so it must not hold a ``maxConcurrent`` slot, and the
    planner may ask for another layout. The agent says so per GPU in the typed
    ``status.gpus[].layoutRefusal`` (``sharing.api.crd.LayoutRefusal``); only answers
    to the *current* spec (its ``metadata.generation``) count, and an entry that
    does not validate is no answer.
    """
    reading = read_gpunode(gpunode)
    return frozenset() if reading is None else _refused(reading)


def _refused(reading: GpuNodeReading) -> frozenset[int]:
    return frozenset(
        g.index for g in reading.gpus if g.layout_refusal is not None and g.layout_refusal.generation == reading.generation
    )


def _desired(want: Mapping[str, Any]) -> tuple[str, ...] | None:
    layout = want.get("layout") if want.get("migEnabled") else None
    return tuple(sorted(str(_map(i).get("profile")) for i in layout)) if isinstance(layout, list) else None


def node_from_objects(gpunode: Mapping[str, Any], node: Mapping[str, Any] | None) -> Node | None:
    """A :class:`Node` from its GPUNode and (optionally) its Node object; None if unusable."""
    reading = read_gpunode(gpunode)
    return None if reading is None else _node(reading, gpunode, node)


def _node(reading: GpuNodeReading, gpunode: Mapping[str, Any], node: Mapping[str, Any] | None) -> Node:
    spec = _map(gpunode.get("spec"))
    spec_gpus = {_int(_map(g).get("index"), -1): _map(g) for g in _list(spec.get("gpus"))}
    idle = idle_record(gpunode)
    refused = _refused(reading)
    gpus: list[Gpu] = []
    for gpu in reading.gpus:
        instances = tuple(sorted(PlacedInstance(i.profile, Placement(i.start, i.size)) for i in gpu.instances))
        in_use = tuple(sorted(PlacedInstance(i.profile, Placement(i.start, i.size)) for i in gpu.instances if i.in_use))
        want = spec_gpus.get(gpu.index, {})
        gpus.append(
            Gpu(
                index=gpu.index,
                memory_mib=gpu.memory_mib,
                mig_enabled=gpu.mig_enabled,
                instances=instances,
                in_use=in_use,
                idle_since=idle.get(gpu.index),
                utilization_percent=gpu.gpu_percent,
                reshaping=gpu.index not in refused and _reshaping(want, gpu.mig_enabled, instances),
                desired=_desired(want),
                healthy=gpu.healthy,
                unhealthy_instances=tuple(sorted(PlacedInstance(i.profile, Placement(i.start, i.size))
                                                 for i in gpu.instances if not i.healthy)),
                users=tuple(sorted((PlacedInstance(i.profile, Placement(i.start, i.size)), i.pods)
                                   for i in gpu.instances if i.pods)),
            )
        )
    node_meta = _map(_map(node).get("metadata"))
    labels = {str(k): str(v) for k, v in _map(node_meta.get("labels")).items()}
    alloc = _map(_map(_map(node).get("status")).get("allocatable"))
    try:
        cpu = int(parse_quantity(alloc["cpu"]) * 1000) if "cpu" in alloc else 0
        memory = int(parse_quantity(alloc["memory"]) / (1024 * 1024)) if "memory" in alloc else 0
    except ValueError:
        cpu = memory = 0
    return Node(
        name=reading.name,
        product=reading.product,
        model=reading.model,
        labels=tuple(sorted(labels.items())),
        sharing=reading.sharing.mode,
        replicas=reading.sharing.replicas,
        gpus=tuple(gpus),
        cpu_milli=cpu,
        memory_mib=memory,
        spec_sharing=reading.spec_sharing.mode,
        spec_replicas=reading.spec_sharing.replicas,
        generation=reading.generation,
        observed_generation=reading.observed_generation,
        degraded=reading.degraded,
        taints=read_taints(_map(_map(node).get("spec"))),
    )


def _with_heartbeat(node: Node, reading: GpuNodeReading, now: datetime | None, stale_after_s: float | None) -> Node:
    silent = seconds_since(reading.heartbeat, now) if now is not None else None
    if stale_after_s is None or silent is None:
        return node
    return replace(node, silent_seconds=silent, stale=silent > stale_after_s)


def busy_gpus(node: Node, pods: Iterable[Pod]) -> dict[int, bool]:
    """Which GPUs of ``node`` count as busy for the idle record."""
    return busy_by_node((node,), pods)[node.name]


def busy_by_node(nodes: Iterable[Node], pods: Iterable[Pod]) -> dict[str, dict[int, bool]]:
    """:func:`busy_gpus` of every node, the pods' claims counted once for all of them."""
    pod_list = tuple(pods)
    mig, taken = mig_claims(pod_list), shared_claims(pod_list)
    return {node.name: _busy(node, mig.get(node.name, Counter()), taken[node.name]) for node in nodes}


def _busy(node: Node, claims: Counter[str], shared: int) -> dict[int, bool]:
    reported = Counter(i.profile for g in node.gpus for i in g.in_use)
    unreported = {p for p, n in claims.items() if n > reported[p]}
    out: dict[int, bool] = {}
    for g in node.gpus:
        if g.mig_enabled:
            out[g.index] = bool(g.in_use) or any(i.profile in unreported for i in g.instances)
        else:
            out[g.index] = shared > 0 or (g.utilization_percent or 0) > 0
    return out


def scoped(snapshot: Snapshot, namespaces: Iterable[str]) -> Snapshot:
    """Only pods of ``namespaces`` are managed (empty: all). Others still hold what they
    are bound or pinned to; their gated or unschedulable pods are simply not ours to place."""
    allowed = set(namespaces)
    if not allowed:
        return snapshot
    pods = tuple(p for p in snapshot.pods if p.namespace in allowed or not (p.gated or p.unschedulable))
    plain = tuple(replace(p, preemptor=None) if p.preemptor is not None and p.preemptor.namespace not in allowed else p
                  for p in snapshot.plain_gpu_pods)
    return replace(snapshot, pods=pods, plain_gpu_pods=plain)


@dataclass(frozen=True)
class NodeParse:
    """What one GPUNode (with its Node) reads as, before the cycle's clock and pods are applied.

    A function of the two objects alone, so a cache may keep it while neither changes
    (``controller.state.incremental``)."""

    reading: GpuNodeReading
    node: Node
    failed: tuple[FailedDevice, ...]


def parse_node(gpunode: Mapping[str, Any], node: Mapping[str, Any] | None) -> NodeParse | None:
    reading = read_gpunode(gpunode)
    if reading is None:
        return None
    return NodeParse(reading, _node(reading, gpunode, node), tuple(_failed_devices(reading)))


@dataclass(frozen=True)
class PodParse:
    """What one pod object contributes to a snapshot: a function of the object alone."""

    pod: Pod | None
    untrusted: str | None
    """``namespace/name: why`` when the pod's allocation is ignored."""
    whole_gpus: int = 0
    """``nvidia.com/gpu`` it holds (any pod, gpupack's or not)."""
    bound: str | None = None
    """The node it is bound to, when it holds whole GPUs."""
    whole_waiting: bool = False
    """Its whole GPUs are demand kube-scheduler found no node for (not gpupack's, Unschedulable)."""
    held_on: str | None = None
    """The node whose CPU and memory it holds: bound there, or (gpupack's) pinned there."""
    cpu_milli: int = 0
    memory_mib: int = 0
    plain: PlainGpuPod | None = None
    """Set for a pod that asks ``nvidia.com/gpu`` itself (not gpupack's), not finished."""
    allocation: Allocation | None = None
    """The record :attr:`pod` was read from (checked against the namespace's policy by :func:`assemble`)."""
    uid: str = ""
    """The object's uid, whatever it is (terminating pods too: ``Snapshot.present``)."""


def parse_pod(obj: Mapping[str, Any]) -> PodParse:
    return replace(_parse_pod(obj), uid=str(_map(obj.get("metadata")).get("uid") or ""))


def _parse_pod(obj: Mapping[str, Any]) -> PodParse:
    pod, allocation, distrust = read_record(obj)
    meta = _map(obj.get("metadata"))
    untrusted = None
    if pod is None and distrust is not None:
        untrusted = f"{meta.get('namespace')}/{meta.get('name')}: {distrust}"
    bound_to = _map(obj.get("spec")).get("nodeName")
    bound = bound_to if isinstance(bound_to, str) and bound_to else None
    held_on = pod.node if pod is not None and not pod.gated else bound
    gpus = whole_gpus_requested(obj)
    theirs = bool(gpus) and ALLOCATION_ANNOTATION not in _map(meta.get("annotations"))
    requested = resources_held(obj) if held_on is not None or theirs else (0, 0)
    cpu, memory = requested if held_on is not None else (0, 0)
    if not gpus:
        return PodParse(pod, untrusted, held_on=held_on, cpu_milli=cpu, memory_mib=memory, allocation=allocation)
    plain = None
    if theirs:
        plain = PlainGpuPod(f"{meta.get('namespace')}/{meta.get('name')}", gpus, *requested,
                            required_products(_map(obj.get("spec"))), bound, priority_of(obj)[0].value,
                            None if bound is not None else plain_preemptor(obj, gpus))
    if bound is not None:
        return PodParse(pod, untrusted, gpus, bound, held_on=held_on, cpu_milli=cpu, memory_mib=memory, plain=plain,
                        allocation=allocation)
    waiting = theirs and waiting_unschedulable(obj)
    return PodParse(pod, untrusted, gpus, None, waiting, held_on=held_on, cpu_milli=cpu, memory_mib=memory, plain=plain,
                    allocation=allocation)


PolicyMerge = Callable[[tuple[Node, ...]], dict[str, NodePolicy]]
"""The merged policy of each node a SharingPolicy selects, given the cycle's nodes."""


def merge_policies(policies: Iterable[Mapping[str, Any]]) -> PolicyMerge:
    """:data:`PolicyMerge` of the SharingPolicy objects; an invalid policy is left out here
    (``controller.writes.policy_status`` reports why on the policy)."""
    specs = [(p.name, p.spec) for p in read_policies(policies) if p.spec is not None]
    return lambda nodes: policies_for_nodes(specs, ((n.name, n.label_map, n.model) for n in nodes))


NamespacePolicy = Callable[[str], AdmissionPolicy]
"""The merged SharingPolicy of a namespace (``sharing.admission.inventory.admission_policy``), as the webhook reads it."""


def namespace_policies(policies: Iterable[Mapping[str, Any]],
                       namespaces: Iterable[Mapping[str, Any]] | None) -> NamespacePolicy:
    """:data:`NamespacePolicy` of the SharingPolicy and Namespace objects, worked out once per namespace.

    A namespace not among ``namespaces`` (None: none known) is read with unknown labels: rules
    that select namespaces by label do not cover it, so its pods are checked against the narrower
    reading until the controller sees the namespace (the webhook, which watches namespaces, checked
    them at create)."""
    specs = tuple((p.name, p.spec) for p in read_policies(policies) if p.spec is not None)
    labels: dict[str, Mapping[str, str]] = {}
    for obj in namespaces or ():
        name, own = name_and_labels(obj)
        if name is not None:
            labels[name] = own
    known: dict[str, AdmissionPolicy] = {}

    def policy_of(namespace: str) -> AdmissionPolicy:
        policy = known.get(namespace)
        if policy is None:
            policy = known[namespace] = admission_policy(specs, namespace, labels.get(namespace))
        return policy

    return policy_of


def within_policy(one: PodParse, policy_of: NamespacePolicy) -> PodParse:
    """``one``, or ``one`` without its pod when its record is one the namespace's SharingPolicy could
    not have produced (``sharing.admission.record_policy``): such a record was written by hand, and gpupack
    neither counts nor releases its pod; the pod is listed in :attr:`PodParse.untrusted`."""
    if one.pod is None or one.allocation is None:
        return one
    problem = record_problem(one.allocation, policy_of(one.pod.namespace))
    if problem is None:
        return one
    return replace(one, pod=None, allocation=None, untrusted=f"{one.pod.key}: {problem}")


def assemble(
    nodes: Iterable[NodeParse], pods: Iterable[PodParse], merge: PolicyMerge, *,
    now: datetime | None = None, stale_after_s: float | None = None, policy_of: NamespacePolicy | None = None,
) -> Snapshot:
    """The snapshot of parsed GPUNodes (in their list order) and pods (in theirs).

    ``policy_of``: each namespace's merged SharingPolicy; a pod whose record it could not have
    produced is left out (:func:`within_policy`). None: no SharingPolicy check (every record counts)."""
    parsed = tuple(nodes)
    pod_parses = tuple(pods) if policy_of is None else tuple(within_policy(p, policy_of) for p in pods)
    whole_taken: Counter[str] = Counter()
    cpu_used: Counter[str] = Counter()
    memory_used: Counter[str] = Counter()
    whole_waiting = 0
    for one in pod_parses:
        if one.bound is not None:
            whole_taken[one.bound] += one.whole_gpus
        elif one.whole_waiting:
            whole_waiting += one.whole_gpus
        if one.held_on is not None:
            cpu_used[one.held_on] += one.cpu_milli
            memory_used[one.held_on] += one.memory_mib
    built = (_with_heartbeat(n.node, n.reading, now, stale_after_s) for n in parsed)
    node_list = tuple(sorted(
        (_with_usage(n, whole_taken[n.name], cpu_used[n.name], memory_used[n.name]) for n in built),
        key=lambda n: n.name,
    ))
    return Snapshot(nodes=node_list, pods=tuple(p.pod for p in pod_parses if p.pod is not None),
                    policies=merge(node_list), whole_waiting=whole_waiting,
                    skipped_entries=tuple(s for n in parsed for s in n.reading.skipped),
                    untrusted_pods=tuple(p.untrusted for p in pod_parses if p.untrusted is not None),
                    mig_config_requests=tuple((n.reading.name, n.reading.mig_config_request) for n in parsed
                                              if n.reading.mig_config_request is not None),
                    plain_gpu_pods=tuple(p.plain for p in pod_parses if p.plain is not None),
                    failed_devices=tuple(f for n in parsed for f in n.failed),
                    present=frozenset(p.uid for p in pod_parses if p.uid))


def _with_usage(node: Node, whole: int, cpu: int, memory: int) -> Node:
    if (node.whole_taken, node.cpu_used_milli, node.memory_used_mib) == (whole, cpu, memory):
        return node  # a reading outlives cycles (controller.state.incremental): copy only on change
    return replace(node, whole_taken=whole, cpu_used_milli=cpu, memory_used_mib=memory)


def object_meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """An object's ``metadata`` (empty when it has none)."""
    meta = obj.get("metadata")
    return meta if type(meta) is dict else _map(meta)  # the common case without an ABC check: every object, every cycle


class SnapshotReader:
    """Builds the cycle's snapshot from the API objects, every object read afresh.

    The one build: :func:`build_snapshot` is this class's, and
    ``controller.state.incremental.SnapshotCache`` overrides the three ``read_*`` steps to keep
    the readings of objects that did not change."""

    def read_nodes(self, gpunodes: Iterable[Mapping[str, Any]],
                   node_objs: Mapping[str, Mapping[str, Any]]) -> list[NodeParse | None]:
        """Each GPUNode's reading, with its Node (by name) when there is one."""
        return [parse_node(g, node_objs.get(str(object_meta(g).get("name")))) for g in gpunodes]

    def read_pods(self, pods: Iterable[Mapping[str, Any]]) -> Iterable[PodParse]:
        """Each pod's reading."""
        return (parse_pod(obj) for obj in pods)

    def read_policies(self, policies: list[Mapping[str, Any]]) -> PolicyMerge:
        """The SharingPolicies, merged per node."""
        return merge_policies(policies)

    def build(
        self,
        gpunodes: Iterable[Mapping[str, Any]],
        nodes: Iterable[Mapping[str, Any]],
        pods: Iterable[Mapping[str, Any]],
        policies: Iterable[Mapping[str, Any]],
        *,
        now: datetime | None = None,
        stale_after_s: float | None = None,
        namespaces: Iterable[Mapping[str, Any]] | None = None,
    ) -> Snapshot:
        """The cycle's snapshot; policies that fail validation are ignored (the webhook rejects
        them at the door).

        With ``now`` and ``stale_after_s`` (the controller's ``agent_stale_seconds``), a node whose
        agent's heartbeat is older than that is marked stale. ``namespaces``: the Namespace objects,
        whose labels the SharingPolicies' namespace rules may select (:func:`namespace_policies`)."""
        node_objs = {str(object_meta(n).get("name")): n for n in nodes}
        parsed = [p for p in self.read_nodes(gpunodes, node_objs) if p is not None]
        policy_list = list(policies)
        # The SharingPolicy check of each pod's record is made afresh every build (the policies and
        # namespaces may change while the pod does not); it reads a few policies, once per namespace.
        return assemble(parsed, self.read_pods(pods), self.read_policies(policy_list),
                        now=now, stale_after_s=stale_after_s, policy_of=namespace_policies(policy_list, namespaces))


build_snapshot = SnapshotReader().build
"""The cycle's snapshot, every object read afresh (:meth:`SnapshotReader.build`;
``controller.state.incremental`` keeps the readings of objects that did not change)."""


def _failed_devices(reading: GpuNodeReading) -> list[FailedDevice]:
    out: list[FailedDevice] = []
    for gpu in reading.gpus:
        faults = [(f"GPU {gpu.index}", gpu.health)] + [
            (f"MIG instance {i.profile}@{i.start} of GPU {gpu.index}", i.health) for i in gpu.instances]
        out.extend(FailedDevice(reading.name, where, h.reason, h.message, tuple(h.pods))
                   for where, h in faults if h is not None)
    return out
