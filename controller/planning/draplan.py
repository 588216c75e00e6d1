"""Placing gated pods on the DRA node pool: the packing engine chooses node and device, per pod.

kube-scheduler's DRA allocator takes the first device that fits; gpupack does
not let it choose. For every gated DRA pod (in the waiting order of
``controller.planning.planner``: priority, then oldest) this module picks the node and, for each GPU container,
the device, and the controller pins the pod's ResourceClaim to exactly that
device (``controller.writes.dra_claims``). Pure: a snapshot, the claims' holds
(``controller.state.dra_usage``) and the time in, a :class:`DraPlan` out.

* **Shares** (``mps``, ``time-slicing``): each container consumes its milli and
  memory rounded by ``SharePolicy`` (what its claim will ask and the
  allocator will count), on a GPU of a node whose GPUNode shares by the pod's
  mode (MIG off), with that much milli and memory free. The node and GPU are
  the choice of the ``sharing.packing`` policy named by ``--policy``, over a
  ``ClusterState`` whose GPUs hold what the claims hold: the model the
  simulator replays for the DRA backend (``sharing.simulator.dra``), so the
  live choice is the measured one.
* **Whole GPUs**: GPUs of an unshared node (``sharing: none``, MIG off) that no
  claim holds, chosen by the same engine.
* **MIG**: ``controller.planning.dramig`` (the GPUs) and ``sharing.dra.mig_choice`` (the choice, which the simulator calls too:
  the node whose CPU, memory and MIG slices are fullest, by ``_Room``'s account of CPU and memory).
* **Pods that ask for no GPU** (mode ``cpu``: labelled ``gpupack.io/backend=dra``):
  a node of the same engine cluster, chosen by the same policy for the pod's CPU
  and memory (what it leaves the GPUs' pods), pinned like any pod; no claim.
* **Preemption**: a pod that fits nowhere may preempt DRA pods of lower priority: a share or
  whole-GPU pod by :meth:`_Shares.preemption`; a MIG pod, or a share whose MIG fallback failed too,
  by ``controller.planning.dra_mig_preemption`` (victims on one MIG GPU, the engine's MIG choice as
  the trial). A MIG preemptor still waiting holds its node's MIG GPUs for the rest of the cycle
  (:func:`_holding`).
* **A share's MIG fallback**: a shared pod the webhook decided for ``auto``
  carries the pool's MIG option (``Pod.mig_fallback``, one profile per
  container). When no shared GPU has room for it, it is tried as a MIG pod of
  those profiles, by the same rules, at its own place in the waiting
  order; its claim then asks for MIG instances (``controller.writes.dra_claims``
  builds each request from the device chosen). Explicit modes and whole-GPU
  pods never change.

A released pod whose claim kube-scheduler has not allocated yet is planned again
when another claim was allocated the device it was pinned to
(``controller.state.dra_usage.broken_promises``: a user's own claim on gpupack's classes,
which the engine does not plan): a device on its node is chosen anew and its
claim is replaced (``DraPlacement.replaces``), or it waits with the reason.

**Stalled promises.** kube-scheduler (v1.37) counts the consumed capacity of a
claim twice for a moment, when the informer has seen its allocation and the
scheduler has not yet dropped it from its in-flight claims; a pod tried just
then finds its pinned share no room on a GPU the engine filled exactly, is set
aside as Unschedulable, and nothing re-queues it for 5 minutes (an allocation
added to another claim is not an event that could help it). A released,
unbound pod that kube-scheduler marked Unschedulable while its own claim is
promised, unallocated, not broken, and at least :data:`REQUEUE_AFTER_S` old
gets its claim re-created with the same pin (``DraPlacement.replaces`` with
``requeues``): a pod's claim being created re-queues the pod. At most
:data:`MAX_REQUEUES` times per pod (the count is on the claim,
``gpupack.io/dra-requeues``); then it waits with the reason.

A pod whose claim already exists is not planned again: if the claim is the
pod's (its ``ownerReferences`` name the pod's UID) and says where it was
pinned, the pod is **adopted** (released to that node: the controller stopped
between creating the claim and lifting the gate); if the name is taken by
something else the pod is **refused** (it stays gated and an Event says why).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import partial

import numpy as np

from controller.planning.dra_mig_preemption import dra_mig_victims
from controller.planning.dramig import mig_gpus
from controller.planning.mig_preemption import REASON_MIG_RESHAPE
from sharing.dra.mig_choice import MigGpu, NodeLoad, place_pod
from controller.state.dra_usage import (ClaimConflict, ClaimRecord, DraUsage, Hold, broken_promises, claim_key,
                                        own_pin)
from controller.planning.planner import Wait, allowed_on, held_by_kueue, waiting_key
from controller.planning.preemption import (REASON_MIG, Preemption, preferring_budgets, reason_for, resume,
                                            still_held, victim)
from sharing.rules.priority import may_preempt
from controller.state.snapshot import Node, Pod, Snapshot
from sharing.api.backend import node_backend
from sharing.dra.pinned import Pinned, PinnedDevice
from sharing.dra.share_policy import SHARES, SharePolicy
from sharing.packing.cluster import ClusterState
from sharing.packing.policy import Policy, decide
from sharing.packing.registry import make_policy
from sharing.packing.specs import GPU_MILLI, NodeSpec, PodPlacement, PodSpec
from sharing.packing.typical import NO_GPU_POD, TypicalPods
from sharing.packing.victim_order import plan_key, victim_key

MiB = 2**20
REQUEUE_AFTER_S = 10.0
"""A stalled promise's claim is re-created once it is this old (module docstring): kube-scheduler's
in-flight claims are dropped within a second of their binding."""
MAX_REQUEUES = 3
"""Re-creations of one pod's stalled promise before it waits with the reason: the race passes in a
second, so a pod still set aside after three is set aside for another reason, which gpupack says."""
_BIG = 10**9
"""CPU and memory of a node whose allocatable is unknown: they never limit the GPU choice."""


@dataclass(frozen=True)
class DraPlacement:
    pod: str
    node: str
    pinned: Pinned
    reason: str
    adopted: bool = False
    """The pod's claim exists already (pinned to ``node``): release the pod, create nothing."""
    replaces: ClaimRecord | None = None
    """Re-pinning a released pod whose claim's promise another claim broke (``broken_promises``):
    this claim is deleted (at this version, still unallocated) and created again, pinned anew."""
    requeues: int = 0
    """Re-creating a stalled promise (module docstring): the claim's new ``gpupack.io/dra-requeues``."""


@dataclass(frozen=True)
class DraPlan:
    placements: tuple[DraPlacement, ...] = ()
    waiting: tuple[Wait, ...] = ()
    refused: tuple[Wait, ...] = ()
    """Pods whose claim name is taken by a claim that is not theirs: never released by gpupack."""
    preemptions: tuple[Preemption, ...] = ()
    """Pods of lower priority to preempt for pods that fit nowhere (:meth:`_Shares.preemption`)."""


def dra_nodes(snapshot: Snapshot) -> tuple[Node, ...]:
    """The DRA pool the engine plans: nodes labelled ``gpupack.io/backend=dra`` whose agent reports."""
    return tuple(n for n in snapshot.nodes if node_backend(n.label_map) == "dra" and not n.stale)


def _cpu_shape(pod: Pod) -> PodSpec:
    """A pod that asks for no GPU as the engine sees it: its CPU and memory."""
    return PodSpec(pod.key, pod.cpu_milli, pod.memory_mib)


_Held = tuple[PodPlacement | None, int, int, int]
"""One hold of a claim in the engine's cluster: its placement (None: it took no milli), node, GPU,
and the memory bytes it took."""


class _Shares:
    """The pool's MIG-off GPUs as the packing engine's cluster, with the claims' holds taken."""

    def __init__(self, nodes: Sequence[Node], usage: DraUsage, pods: Sequence[Pod], policy_name: str,
                 share: SharePolicy) -> None:
        self.share = share
        self.nodes = tuple(n for n in nodes if n.full_gpus and n.sharing == n.spec_sharing)
        self.memory_free: dict[tuple[int, int], int] = {}
        self.memory_max: dict[tuple[int, int], int] = {}
        """The largest share of memory a GPU's request policy serves (whole units)."""
        # The typical pods are the pool's pods the engine places: GPU pods (their first share) and
        # the pods that ask for no GPU, as the simulator's PresentTypical with cpu_pods="engine".
        shapes = [s for p in pods if p.mode not in ("mig", "cpu") for s in self._shapes(p, self._accepted(p))[:1]]
        shapes += [_cpu_shape(p) for p in pods if p.mode == "cpu"]
        typical = TypicalPods.from_pods(shapes or [NO_GPU_POD])
        self.policy: Policy = make_policy(policy_name, rng=np.random.default_rng(0), typical=typical)
        self.cluster: ClusterState | None = None
        self.held: dict[str, list[_Held]] = {}
        """Per claim, what its holds take of the engine's cluster (to lift them for a preemption's trial)."""
        if not self.nodes:
            return
        self.cluster = ClusterState([NodeSpec(n.name, n.cpu_milli or _BIG, n.memory_mib or _BIG, len(n.full_gpus),
                                              _key(n)) for n in self.nodes])
        where = {(n.name, g.index): (i, j) for i, n in enumerate(self.nodes) for j, g in enumerate(n.full_gpus)}
        for i, n in enumerate(self.nodes):
            # What the node's pods request (any pod, bound or pinned there) is not the engine's to
            # give: kube-scheduler would find no room for a pod pinned past it.
            if n.room is not None and (n.cpu_used_milli or n.memory_used_mib):
                used = PodSpec(f"used/{n.name}", min(n.cpu_used_milli, n.cpu_milli),
                               min(n.memory_used_mib, n.memory_mib))
                self.cluster.place(used, i, ())
            for j, g in enumerate(n.full_gpus):
                self.memory_free[i, j] = g.memory_mib * MiB
                self.memory_max[i, j] = share.max_memory(g.memory_mib * MiB)
        for hold in usage.holds:
            at = where.get((hold.node, hold.device.gpu))
            if at is None or hold.device.kind == "mig":
                continue
            i, j = at
            shared = hold.device.kind == "shared"
            # A whole GPU's claim takes all of it; a hold past what is free (claims allocated before
            # a GPU shrank, say) leaves nothing, never a negative.
            milli = min(int(self.cluster.gpu_free[i, j]), hold.device.milli if shared else GPU_MILLI)
            placed = self.cluster.place(PodSpec(f"held/{hold.claim}", 0, 0, 1, milli), i, (j,)) if milli > 0 else None
            before = self.memory_free[i, j]
            self.memory_free[i, j] = max(0, self.memory_free[i, j] - hold.device.memory_bytes) if shared else 0
            self.held.setdefault(hold.claim, []).append((placed, i, j, before - self.memory_free[i, j]))

    def _accepted(self, pod: Pod) -> tuple[str, ...]:
        wanted = "none" if pod.mode == "whole" else pod.mode
        return tuple(sorted({_key(n) for n in self.nodes if n.sharing == wanted
                             and (not pod.products or n.product in pod.products)}))

    def _shapes(self, pod: Pod, accepted: tuple[str, ...]) -> list[PodSpec]:
        """The engine's pods: one whole-GPU pod of all containers, or one share per container."""
        spec = "|".join(accepted)
        if pod.mode == "whole":
            return [PodSpec(pod.key, pod.cpu_milli, pod.memory_mib, len(pod.milli), GPU_MILLI, accepted, spec)]
        return [PodSpec(pod.key, pod.cpu_milli if k == 0 else 0, pod.memory_mib if k == 0 else 0, 1,
                        min(GPU_MILLI, self.share.consumed_milli(m)), accepted, spec)
                for k, m in enumerate(pod.milli)]

    def _memory(self, pod: Pod, k: int) -> int:
        return self.share.consumed_memory(pod.memory_bytes[k]) if pod.mode != "whole" else 0

    def _gpu_for(self, node: int, share: PodSpec, memory: int, preferred: int | None) -> int | None:
        """``preferred`` (the policy's GPU) when the share fits its milli and memory there, else the
        best fit: the GPU with the least free milli that holds both."""
        assert self.cluster is not None
        free = self.cluster.gpu_free[node]
        fits = [j for j in range(len(self.nodes[node].full_gpus))
                if free[j] >= share.gpu_milli and self.memory_free[node, j] >= memory <= self.memory_max[node, j]]
        if preferred in fits:
            return preferred
        return min(fits, key=lambda j: (int(free[j]), j)) if fits else None

    def _fits(self, node: int, pod: Pod, shapes: list[PodSpec]) -> bool:
        """The node has the pod's CPU and memory left and every container fits it at once (shares:
        a best-fit trial, undone)."""
        assert self.cluster is not None
        if self.cluster.cpu_free[node] < shapes[0].cpu_milli or self.cluster.mem_free[node] < shapes[0].memory_mib:
            return False
        if pod.mode == "whole":
            gpu_memory = min(g.memory_mib for g in self.nodes[node].full_gpus) * MiB
            return all(m is None or m <= gpu_memory for m in pod.memory_bytes)
        placed = self._commit(node, pod, shapes, None, use_policy=False)
        if placed is None:
            return False
        self._undo(node, pod, shapes, placed)
        return True

    def _commit(self, node: int, pod: Pod, shapes: list[PodSpec], first: int | None, *,
                use_policy: bool) -> list[int] | None:
        """Each share's GPU on ``node`` (largest first), committed: container 0 on ``first`` and the
        others on the policy's GPU when they fit there (else best fit). None, with nothing committed,
        when one does not fit. The policy only ever sees the true cluster (its caches rely on it)."""
        assert self.cluster is not None
        gpus: dict[int, int] = {}
        for k in sorted(range(len(shapes)), key=lambda k: (-shapes[k].gpu_milli, k)):
            preferred = first if k == 0 else (
                self.policy.choose_gpus(self.cluster, shapes[k], node)[0] if use_policy else None)
            j = self._gpu_for(node, shapes[k], self._memory(pod, k), preferred)
            if j is None:
                self._undo(node, pod, shapes, gpus)
                return None
            self.cluster.place(shapes[k], node, (j,))
            self.memory_free[node, j] -= self._memory(pod, k)
            gpus[k] = j
        return [gpus[k] for k in range(len(shapes))]

    def _undo(self, node: int, pod: Pod, shapes: list[PodSpec], gpus: dict[int, int] | list[int]) -> None:
        assert self.cluster is not None
        for k, j in (gpus.items() if isinstance(gpus, dict) else enumerate(gpus)):
            self.cluster.remove(PodPlacement(shapes[k], node, (j,)))
            self.memory_free[node, j] += self._memory(pod, k)

    def _lift(self, claim: str) -> list[_Held]:
        """Give back what ``claim`` holds (a trial: :meth:`_restore` takes it again)."""
        assert self.cluster is not None
        entries = self.held.get(claim, [])
        for placed, i, j, memory in entries:
            if placed is not None:
                self.cluster.remove(placed)
            self.memory_free[i, j] += memory
        return entries

    def _restore(self, entries: list[_Held]) -> None:
        assert self.cluster is not None
        for placed, i, j, memory in entries:
            if placed is not None:
                self.cluster.place(placed.pod, placed.node, placed.gpus)
            self.memory_free[i, j] -= memory

    def preemption(self, pod: Pod, pods: Sequence[Pod], spared: set[str]) -> Preemption | None:
        """The DRA pool's preemption for a gated share or whole-GPU pod that fits nowhere
        (``controller.planning.preemption`` has the rules): per node, the node's DRA pods of strictly
        lower priority, lowest priority and least milli first, each one's claim lifted in turn until
        the pod fits (the same trial :meth:`place` makes); fewest victims, then lowest highest-victim
        priority, then least milli (``sharing.packing.victim_order``'s orders), then the node's order.
        Their CPU and memory are not counted as
        freed (a conservative trial). None when no node would do, or the pod may not preempt."""
        if self.cluster is None or not pod.gated or not pod.priority.preempts or pod.victims or pod.queue_held:
            return None
        accepted = self._accepted(pod)
        if not accepted:
            return None
        shapes = self._shapes(pod, accepted)
        best: tuple[tuple[int, int, int, int, int], Node, list[Pod]] | None = None
        for i, node in enumerate(self.nodes):
            if _key(node) not in accepted or not allowed_on(pod, node):
                continue
            candidates = sorted((v for v in pods if v.node == node.name and not v.gated and v.claim and v.uid
                                 and v.key not in spared and may_preempt(pod.priority, v.priority.value)
                                 and claim_key(v) in self.held),
                                key=lambda v: victim_key(v.priority.value, sum(v.milli), v.key))
            lifted: list[_Held] = []
            chosen: list[Pod] = []
            for candidate in candidates:
                lifted += self._lift(claim_key(candidate))
                chosen.append(candidate)
                if self._fits(i, pod, shapes):
                    rank = (*plan_key([v.priority.value for v in chosen], sum(sum(v.milli) for v in chosen)), i)
                    if best is None or rank < best[0]:
                        best = (rank, node, list(chosen))
                    break
            self._restore(lifted)
        if best is None:
            return None
        _, node, victims = best
        return Preemption(pod.key, node.name, tuple(victim(v) for v in victims),
                          f"{pod.key} (priority {pod.priority.value}) fits nowhere on the DRA pool; preempting "
                          f"{', '.join(v.key for v in victims)} on {node.name}", reason_for(pod))

    def take_cpu(self, node_name: str, pod: Pod) -> None:
        """``pod``'s CPU and memory, placed on ``node_name`` by the MIG path, taken here too."""
        i = next((i for i, n in enumerate(self.nodes) if n.name == node_name), None)
        if self.cluster is not None and i is not None and (pod.cpu_milli or pod.memory_mib):
            cpu = min(pod.cpu_milli, int(self.cluster.cpu_free[i]))
            memory = min(pod.memory_mib, int(self.cluster.mem_free[i]))
            self.cluster.place(PodSpec(f"mig/{pod.key}", cpu, memory), i, ())

    def place_cpu(self, pod: Pod) -> Node | str:
        """The node the engine gives ``pod``, which asks for no GPU (committed), or why none: the
        policy scores its CPU and memory against what the GPUs of each node still need, as the
        simulator's ``cpu_pods="engine"`` does (``sharing.simulator.dra.DraReplay``)."""
        if self.cluster is None:
            return "no DRA node has a healthy GPU with MIG off"
        spec = _cpu_shape(pod)
        allowed = np.array([allowed_on(pod, n) for n in self.nodes], dtype=bool)
        outcome = decide(self.cluster, spec, self.policy, allowed)
        if not isinstance(outcome, PodPlacement):
            return "; ".join(outcome.reasons)
        self.cluster.place(spec, outcome.node, ())
        return self.nodes[outcome.node]

    def place(self, pod: Pod) -> tuple[Node, list[PinnedDevice]] | str:
        """Where the engine puts ``pod``'s containers (committed), or why nowhere."""
        if self.cluster is None:
            return "no DRA node has a healthy GPU with MIG off"
        for milli in pod.milli:
            if pod.mode != "whole" and self.share.consumed_milli(milli) > GPU_MILLI:
                return f"a share of {milli} milli rounds past a whole GPU"
        accepted = self._accepted(pod)
        if not accepted:
            return f"no DRA node {'is unshared' if pod.mode == 'whole' else f'shares by {pod.mode}'}" + (
                f" with {'/'.join(pod.products)}" if pod.products else "")
        shapes = self._shapes(pod, accepted)
        allowed = np.array([allowed_on(pod, n) and self._fits(i, pod, shapes) for i, n in enumerate(self.nodes)],
                           dtype=bool)
        outcome = decide(self.cluster, shapes[0], self.policy, allowed)
        if not isinstance(outcome, PodPlacement):
            return "; ".join(outcome.reasons)
        node = self.nodes[outcome.node]
        if pod.mode == "whole":
            self.cluster.place(shapes[0], outcome.node, outcome.gpus)
            return node, [PinnedDevice(r, "gpu", node.full_gpus[j].index) for r, j in zip(pod.requests, outcome.gpus)]
        # The policy's GPUs first; if they split the pod badly, the best fit the trial found.
        gpus = (self._commit(outcome.node, pod, shapes, outcome.gpus[0], use_policy=True)
                or self._commit(outcome.node, pod, shapes, None, use_policy=False))
        if gpus is None:  # the trial passed on this very state: cannot happen
            return f"the engine's node {node.name} cannot hold every container"
        return node, [PinnedDevice(r, "shared", node.full_gpus[j].index, shapes[k].gpu_milli, self._memory(pod, k))
                      for k, (r, j) in enumerate(zip(pod.requests, gpus))]


class _Room:
    """The CPU milli and memory MiB each DRA node has left this cycle: its allocatable less what its
    pods request, less this cycle's placements (a node whose allocatable is unknown never limits).
    The MIG path checks it; the shares' engine cluster keeps the same account in its own state."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.left: dict[str, tuple[int, int] | None] = {n.name: n.room for n in nodes}
        self.allocatable = {n.name: (n.cpu_milli, n.memory_mib) for n in nodes}

    def loads(self) -> dict[str, NodeLoad]:
        """Each node's CPU and memory as the MIG choice scores them (unknown allocatable: left out)."""
        out: dict[str, NodeLoad] = {}
        for name, left in self.left.items():
            if left is not None:
                cpu, memory = self.allocatable[name]
                out[name] = NodeLoad(cpu - left[0], cpu, memory - left[1], memory)
        return out

    def fits(self, node: str, pod: Pod) -> bool:
        left = self.left.get(node)
        return left is None or (left[0] >= pod.cpu_milli and left[1] >= pod.memory_mib)

    def take(self, node: str, pod: Pod) -> None:
        left = self.left.get(node)
        if left is not None:
            self.left[node] = (left[0] - pod.cpu_milli, left[1] - pod.memory_mib)


def _key(node: Node) -> str:
    """The engine's GPU "model" of a node: how it offers its MIG-off GPUs, and its product."""
    return f"{node.sharing}/{node.product}"


def _mig(gpus: list[MigGpu], pod: Pod, profiles: tuple[str, ...], nodes: Sequence[Node],
         room: _Room) -> tuple[Node, list[PinnedDevice]] | str:
    """MIG instances of ``profiles`` (one per container) for ``pod`` on one node with its CPU and
    memory left (committed), or why none."""
    if len(profiles) != len(pod.requests):
        return "a MIG container names no profile"
    allowed = {n.name for n in nodes if allowed_on(pod, n) and room.fits(n.name, pod)}
    picks = place_pod([g for g in gpus if g.node in allowed], profiles, room.loads(), pod.cpu_milli, pod.memory_mib)
    if picks is None:
        return (f"no DRA GPU offers {', '.join(sorted(profiles))} on one node now (free placements, "
                "allowed profiles, policy window)")
    node = next(n for n in nodes if n.name == picks[0][0].node)
    return node, [PinnedDevice(r, "mig", g.index, profile=i.profile, start=i.placement.start)
                  for r, (g, i) in zip(pod.requests, picks)]


def _holding(mig: list[MigGpu], pod: Pod) -> list[MigGpu]:
    """``mig`` less the MIG GPUs of the node a waiting MIG preemptor is pinned to: what its victims
    free (an instance left idle, slices the agent has not reported destroyed yet) is held for it, as
    the device-plugin pool holds the node, so no pod after it in the order takes that place."""
    if not pod.victims or pod.node is None or (pod.mode != "mig" and not pod.mig_fallback):
        return mig
    return [g for g in mig if g.node != pod.node]


def _mig_preemption(pod: Pod, profiles: tuple[str, ...], nodes: Sequence[Node], pods: Sequence[Pod],
                    mig: list[MigGpu], holds: Sequence[Hold], snapshot: Snapshot, now: datetime, room: _Room,
                    spared: set[str]) -> Preemption | None:
    """The DRA pool's preemption for a MIG pod (or a share's MIG fallback, ``profiles``) that fits
    nowhere: ``controller.planning.dra_mig_preemption``'s victims, tried by :func:`_mig` itself."""
    def fits(gpus: list[MigGpu], node: Node) -> bool:
        return not isinstance(_mig(gpus, pod, profiles, [node], room), str)

    found = dra_mig_victims(pod, profiles, nodes, pods, mig, holds, snapshot.policies, now, spared, fits)
    if found is None:
        return None
    names = ", ".join(v.key for v in found.victims)
    how = f"to re-lay out GPU {found.gpu} for" if found.reshape else f"to free GPU {found.gpu}'s instances for"
    return Preemption(pod.key, found.node.name, tuple(victim(v) for v in found.victims),
                      f"{pod.key} (priority {pod.priority.value}) fits nowhere on the DRA pool; preempting {names} "
                      f"(priority {max(v.priority.value for v in found.victims)} or lower) on {found.node.name} "
                      f"{how} {', '.join(sorted(profiles))}",
                      REASON_MIG_RESHAPE if found.reshape else REASON_MIG, gpu=found.gpu if found.reshape else None)


def _to_repin(pods: Sequence[Pod], usage: DraUsage, broken: Mapping[str, str]) -> list[tuple[Pod, ClaimRecord, str]]:
    """Released, unbound pods whose own claim is a broken promise (``broken``: ``broken_promises``;
    oldest first), with why."""
    if not broken:
        return []
    out: list[tuple[Pod, ClaimRecord, str]] = []
    for pod in sorted(pods, key=lambda p: (p.created, p.key)):
        record = usage.claims.get(claim_key(pod))
        if pod.gated or pod.bound or pod.mode == "cpu" or pod.node is None or record is None:
            continue
        if record.key in broken and not record.allocated and not isinstance(own_pin(record, pod.uid), ClaimConflict):
            out.append((pod, record, broken[record.key]))
    return out


def _stalled(pods: Sequence[Pod], usage: DraUsage, broken: Mapping[str, str], now: datetime) -> tuple[
        list[DraPlacement], list[Wait]]:
    """Released pods kube-scheduler set aside while their own promise stands (module docstring,
    "Stalled promises"; ``broken``: ``broken_promises``): their claims re-created with the same pin,
    or why not any more."""
    again: list[DraPlacement] = []
    waits: list[Wait] = []
    for pod in sorted(pods, key=lambda p: (p.created, p.key)):
        record = usage.claims.get(claim_key(pod))
        if not pod.unschedulable or pod.mode == "cpu" or record is None or record.allocated or record.key in broken:
            continue
        pinned = own_pin(record, pod.uid)
        if isinstance(pinned, ClaimConflict) or record.created is None:
            continue
        if (now - record.created).total_seconds() < REQUEUE_AFTER_S:
            continue
        why = f"kube-scheduler set the pod aside while the device its ResourceClaim {record.key} is pinned to has room"
        if record.requeues >= MAX_REQUEUES:
            waits.append(Wait(pod.key, f"{why}; the claim was re-created {record.requeues} times, no more"))
            continue
        what = ", ".join(d.device for d in pinned.devices)
        again.append(DraPlacement(pod.key, pinned.node, pinned,
                                  f"{what} on {pinned.node} (claim re-created, same pin: {why})",
                                  replaces=record, requeues=record.requeues + 1))
    return again, waits


def plan_dra(snapshot: Snapshot, usage: DraUsage, now: datetime, *, policy_name: str = "gpupack",
             share: SharePolicy = SHARES, protected: frozenset[str] = frozenset()) -> DraPlan:
    """The DRA pool's placements for one cycle (see the module docstring); ``protected``: pods a
    PodDisruptionBudget protects now, preempted only where nothing else makes room."""
    nodes = dra_nodes(snapshot)
    # Kueue's quota comes first, as on the device-plugin pool: a pod still at Kueue's admission gate
    # is no demand (no device is pinned, no claim adopted, no victim chosen for it); it is only reported.
    kueue_waits = [held_by_kueue(p, snapshot, now) for p in snapshot.pods if p.backend == "dra" and p.queue_held and p.gated]
    pods = [p for p in snapshot.pods if p.backend == "dra" and not p.queue_held]
    waiting = sorted((p for p in pods if p.gated), key=waiting_key)
    placements: list[DraPlacement] = []
    waits: list[Wait] = kueue_waits
    refused: list[Wait] = []
    todo: list[Pod] = []
    for pod in waiting:
        if pod.mode == "cpu":  # asks for no GPU: no claim to adopt
            todo.append(pod)
            continue
        record = usage.claims.get(claim_key(pod))
        if record is None:
            todo.append(pod)
            continue
        pinned = own_pin(record, pod.uid)
        if isinstance(pinned, ClaimConflict):
            (refused if pinned.foreign else waits).append(Wait(pod.key, pinned.why))
        else:
            placements.append(DraPlacement(pod.key, pinned.node, pinned,
                                           f"claim {record.key} already pinned to {pinned.node}", True))
    broken = broken_promises(usage, nodes)  # read once: repins and stalled promises split on it
    repin = _to_repin(pods, usage, broken)
    requeued, stalled = _stalled(pods, usage, broken, now)
    placements += requeued
    waits += stalled
    if not todo and not repin:
        return DraPlan(tuple(placements), tuple(waits), tuple(refused))
    if repin:  # their broken promises hold nothing: each is placed again, on its node
        gone = {record.key for _, record, _ in repin}
        usage = replace(usage, holds=tuple(h for h in usage.holds if h.claim not in gone))
    shares = _Shares(nodes, usage, pods, policy_name, share)
    mig = mig_gpus(nodes, usage.holds, snapshot.policies, now)
    room = _Room(nodes)
    for pod, record, why in repin:
        # Its CPU and memory are counted on its node already (it is pinned there).
        again = replace(pod, cpu_milli=0, memory_mib=0)
        found = (_mig(mig, again, again.profiles, nodes, room) if pod.mode == "mig" else shares.place(again))
        if isinstance(found, str):
            waits.append(Wait(pod.key, f"ResourceClaim {record.key}: {why}; no other device on {pod.node} has "
                                       f"room now ({found})"))
            continue
        node, devices = found
        if pod.mode == "mig":
            shares.take_cpu(node.name, again)
        what = ", ".join(d.device for d in devices)
        placements.append(DraPlacement(pod.key, node.name, Pinned(node.name, tuple(devices)),
                                       f"{what} on {node.name} (re-pinned: {why})", replaces=record))
    running = {p.uid: p for p in snapshot.pods if p.uid}
    preemptions: list[Preemption] = []
    doomed: set[str] = set()
    for pod in todo:
        held = still_held(pod, snapshot, running)
        if held is not None:
            # Its victims' claims hold the place until they are gone: it waits, and never preempts again.
            resumed = resume(pod, held)
            if resumed is not None:
                preemptions.append(resumed)
                doomed.update(v.key for v in resumed.victims)
            waits.append(Wait(pod.key, f"waiting on {pod.node} for {held.count} pod(s) it preempted to terminate",
                              preempting=True))
            mig = _holding(mig, pod)
            continue
        if pod.mode == "cpu":
            chosen = shares.place_cpu(pod)
            if isinstance(chosen, str):
                waits.append(Wait(pod.key, chosen))
            else:
                room.take(chosen.name, pod)
                placements.append(DraPlacement(pod.key, chosen.name, Pinned(chosen.name, ()),
                                               f"no GPU, {pod.cpu_milli} CPU milli on {chosen.name} (packing engine)"))
            continue
        found = _mig(mig, pod, pod.profiles, nodes, room) if pod.mode == "mig" else shares.place(pod)
        how = "packing engine"
        on_mig = pod.mode == "mig"
        if isinstance(found, str) and pod.mode != "mig" and pod.mig_fallback:
            on_mig = True
            fallback = _mig(mig, pod, pod.mig_fallback, nodes, room)
            how = f"packing engine; MIG fallback: {found}"
            found = fallback if not isinstance(fallback, str) else f"{found}; MIG fallback: {fallback}"
        if isinstance(found, str):
            chosen_preemption = preferring_budgets(partial(shares.preemption, pod, pods), doomed,
                                                   protected) if pod.mode != "mig" else None
            if chosen_preemption is None and on_mig:
                profiles = pod.profiles if pod.mode == "mig" else pod.mig_fallback
                chosen_preemption = preferring_budgets(
                    partial(_mig_preemption, pod, profiles, nodes, pods, mig, usage.holds, snapshot, now, room),
                    doomed, protected)
            if chosen_preemption is None:
                held_for = on_mig and bool(pod.victims) and pod.node is not None
                waits.append(Wait(pod.key, f"waiting on {pod.node}, held for it, for the MIG instances its victims "
                                           f"held to be freed ({found})", preempting=True) if held_for
                             else Wait(pod.key, found))
                mig = _holding(mig, pod)
                continue
            preemptions.append(chosen_preemption)
            doomed.update(v.key for v in chosen_preemption.victims)
            waits.append(Wait(pod.key, f"preempting {len(chosen_preemption.victims)} pod(s) of lower priority on "
                                       f"{chosen_preemption.node}; {found}", preempting=True))
            continue
        node, devices = found
        room.take(node.name, pod)
        if on_mig:
            shares.take_cpu(node.name, pod)
        what = ", ".join(d.device for d in devices)
        placements.append(DraPlacement(pod.key, node.name, Pinned(node.name, tuple(devices)),
                                       f"{what} on {node.name} ({how})"))
    return DraPlan(tuple(placements), tuple(waits), tuple(refused), tuple(preemptions))
