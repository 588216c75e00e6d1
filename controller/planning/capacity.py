"""What is free where: MIG instances and shared replicas not claimed by any pod.

Claims come from pods, not from the agent's ``inUse`` flags alone: a pod the
controller has just released (pinned to a node, gate lifted) holds its
instance before the agent ever sees a process on it. Per node and profile the
busy count is the larger of the pods claiming it and the instances the agent
reports in use, so neither a slow agent nor a slow scheduler makes the
controller hand one instance to two pods.

The ledger keeps indices beside its counts, so placing one pod looks at the
nodes with room rather than at every node of the cluster: per MIG profile a
heap of the nodes with a free instance of it, ordered as the planner's best fit
orders them (fewest free instances, then name), and the names of the nodes with
free whole GPUs or capacity in flight. The indices follow every change made
through the ledger's methods; nothing else may change the counts.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from controller.state.claims import mig_claims, shared_claims, whole_pinned
from controller.state.snapshot import Gpu, Node, Pod, Snapshot


def settled_gpus(node: Node) -> tuple[Gpu, ...]:
    """MIG-enabled GPUs whose reported instances are final (no reshape in flight)."""
    return tuple(g for g in node.gpus if g.mig_enabled and not g.reshaping)


def unreported_claims(node: Node, claims: Counter[str]) -> Counter[str]:
    """Per profile, pods on the node the agent has not (yet) reported as users."""
    reported = Counter(i.profile for g in node.gpus for i in g.in_use)
    return Counter({p: n - reported[p] for p, n in claims.items() if n > reported[p]})


class MigIndex:
    """Per MIG profile, the nodes with a free instance of it, best fit first.

    A heap per profile holds ``(free instances of the node, name, stamp)``; a node's entries
    are pushed again whenever its free count changes (:meth:`touched`), and an entry whose
    stamp is not the node's latest is stale and dropped when met. So the first valid entry
    of a heap is the node with the fewest free instances (then the smallest name) among
    those with that profile free: the planner's ``min`` over every node, found without
    looking at every node."""

    def __init__(self, free: dict[str, Counter[str]]) -> None:
        self._free = free
        self._stamp: dict[str, int] = {}
        self._heaps: dict[str, list[tuple[int, str, int]]] = {}
        for name in free:
            self.touched(name)

    def touched(self, node: str) -> None:
        stamp = self._stamp.get(node, 0) + 1
        self._stamp[node] = stamp
        counts = self._free.get(node)
        if not counts:
            return
        total = sum(counts.values())
        for profile, n in counts.items():
            if n > 0:
                heapq.heappush(self._heaps.setdefault(profile, []), (total, node, stamp))

    def best(self, need: Counter[str], allowed: Callable[[str], bool]) -> str | None:
        """The node with every instance of ``need`` free that ``allowed`` accepts, fewest free
        instances first, then by name; None when there is none. ``need`` must name a profile."""
        profile = min((p for p in need), key=lambda p: (len(self._heaps.get(p, ())), p))
        heap = self._heaps.get(profile, [])
        passed: list[tuple[int, str, int]] = []
        found: str | None = None
        while heap:
            entry = heapq.heappop(heap)
            _, node, stamp = entry
            if stamp != self._stamp.get(node):
                continue  # the node's count changed since: a newer entry stands for it
            passed.append(entry)
            counts = self._free.get(node) or Counter()
            if all(counts[p] >= k for p, k in need.items()) and allowed(node):
                found = node
                break
        for entry in passed:
            heapq.heappush(heap, entry)
        return found


@dataclass
class FreeCapacity:
    """Mutable ledger for one planning cycle: free instances/replicas, reduced as pods are released."""

    mig: dict[str, Counter[str]] = field(default_factory=dict)
    shared: Counter[str] = field(default_factory=Counter)
    incoming_mig: dict[str, Counter[str]] = field(default_factory=dict)
    """Instances a reshape in flight will create (spec written, agent not done), not yet promised."""
    incoming_shared: Counter[str] = field(default_factory=Counter)
    """Replicas a sharing change in flight will add, not yet promised."""
    whole: Counter[str] = field(default_factory=Counter)
    """Whole GPUs (``nvidia.com/gpu``) free on nodes that do not share their GPUs."""
    incoming_whole: Counter[str] = field(default_factory=Counter)
    """Whole GPUs a node switching back from sharing will hand out, not yet promised."""
    mig_index: MigIndex | None = None
    """Built on first use (:meth:`best_mig`), then kept up to date by the methods below."""
    incoming_mig_nodes: set[str] = field(default_factory=set)
    """Nodes with an entry in ``incoming_mig`` (a superset of those with instances in flight)."""
    whole_nodes: set[str] = field(default_factory=set)
    """Nodes that had free whole GPUs when the ledger was made (``whole`` only decreases)."""
    incoming_whole_nodes: set[str] = field(default_factory=set)
    incoming_shared_nodes: set[str] = field(default_factory=set)
    room: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Node -> (CPU milli, memory MiB) not requested by any pod: kube-scheduler binds a pod only
    where its own requests fit, so a node without room for a pod is no place for it whatever
    GPUs it has free. Nodes whose allocatable is unknown are absent (no limit)."""

    @classmethod
    def of(cls, snapshot: Snapshot, claims: dict[str, Counter[str]] | None = None) -> FreeCapacity:
        """The ledger of ``snapshot``; ``claims``: ``mig_claims(snapshot.pods)`` when the caller has it."""
        claims = mig_claims(snapshot.pods) if claims is None else claims
        taken = shared_claims(snapshot.pods)
        pinned = whole_pinned(snapshot.pods)
        ledger = cls()
        nothing: Counter[str] = Counter()
        for node in snapshot.nodes:
            existing: Counter[str] = Counter()
            reported: Counter[str] = Counter()
            desired: list[tuple[str, ...]] = []
            for gpu in node.gpus:
                if gpu.mig_enabled and not gpu.reshaping:  # settled_gpus
                    existing.update(gpu.offered)
                if gpu.in_use:
                    reported.update(i.profile for i in gpu.in_use)
                if gpu.reshaping and gpu.desired is not None:
                    desired.append(gpu.desired)
            busy = claims.get(node.name, nothing)
            free = Counter({p: n - max(busy[p], reported[p]) for p, n in existing.items()})
            ledger.mig[node.name] = +free  # unary plus drops zero and negative counts
            if not desired:
                # Nothing being created: what is free is all there will be (and +free has no zeros).
                ledger.incoming_mig[node.name] = Counter()
            else:
                future = Counter(existing)
                for profiles in desired:
                    future.update(profiles)
                future_free = Counter({p: n - max(busy[p], reported[p]) for p, n in future.items()})
                ledger.incoming_mig[node.name] = +(future_free - ledger.mig[node.name])
            if node.sharing != "none" and node.sharing == node.spec_sharing and node.replicas == node.spec_replicas:
                ledger.shared[node.name] = max(0, len(node.full_gpus) * node.replicas - taken[node.name])
            elif node.spec_sharing != "none":
                ledger.incoming_shared[node.name] = max(0, len(node.full_gpus) * node.spec_replicas - taken[node.name])
            whole = max(0, len(node.full_gpus) - node.whole_taken - pinned[node.name])
            if node.sharing == "none" and node.spec_sharing == "none":
                ledger.whole[node.name] = whole
            elif node.spec_sharing == "none":
                ledger.incoming_whole[node.name] = whole
            if node.room is not None:
                ledger.room[node.name] = node.room
        ledger.incoming_mig_nodes = {n for n, c in ledger.incoming_mig.items() if c}
        ledger.whole_nodes = {n for n, c in ledger.whole.items() if c > 0}
        ledger.incoming_whole_nodes = {n for n, c in ledger.incoming_whole.items() if c > 0}
        ledger.incoming_shared_nodes = {n for n, c in ledger.incoming_shared.items() if c > 0}
        return ledger

    def best_mig(self, need: Counter[str], allowed: Callable[[str], bool]) -> str | None:
        """Best fit for ``need`` (a non-empty profile count): see :meth:`MigIndex.best`."""
        if self.mig_index is None:
            self.mig_index = MigIndex(self.mig)
        return self.mig_index.best(need, allowed)

    def destroy_mig(self, node: str, profiles: Iterable[str]) -> None:
        """Instances about to be destroyed by a layout change are no longer free."""
        free = self.mig.setdefault(node, Counter())
        free.subtract(Counter(profiles))
        self.mig[node] = +free
        if self.mig_index is not None:
            self.mig_index.touched(node)

    def add_incoming_mig(self, node: str, spare: Counter[str]) -> None:
        self.incoming_mig.setdefault(node, Counter()).update(spare)
        if self.incoming_mig[node]:
            self.incoming_mig_nodes.add(node)

    def mig_free(self, node: str) -> Counter[str]:
        return self.mig.get(node, Counter())

    def take_mig(self, node: str, profiles: tuple[str, ...]) -> None:
        free = self.mig.setdefault(node, Counter())
        need = Counter(profiles)
        if any(free[p] < n for p, n in need.items()):
            raise ValueError(f"node {node} lacks free instances for {sorted(need.elements())}")
        free.subtract(need)
        if self.mig_index is not None:
            self.mig_index.touched(node)

    def fits(self, node: str, pod: Pod) -> bool:
        """The pod's CPU and memory requests fit in what the node has left."""
        room = self.room.get(node)
        return room is None or (pod.cpu_milli <= room[0] and pod.memory_mib <= room[1])

    def take_room(self, node: str, pod: Pod) -> None:
        """A pod released to ``node`` holds its CPU and memory there from now on."""
        room = self.room.get(node)
        if room is not None:
            self.room[node] = (room[0] - pod.cpu_milli, room[1] - pod.memory_mib)

    def take_whole(self, node: str, gpus: int) -> None:
        if self.whole[node] < gpus:
            raise ValueError(f"node {node} has {self.whole[node]} free whole GPUs, {gpus} needed")
        self.whole[node] -= gpus

    def take_shared(self, node: str, shares: int) -> None:
        if self.shared[node] < shares:
            raise ValueError(f"node {node} has {self.shared[node]} free shared replicas, {shares} needed")
        self.shared[node] -= shares
