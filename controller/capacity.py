"""What is free where: MIG instances and shared replicas not claimed by any pod.

Claims come from pods, not from the agent's ``inUse`` flags alone: a pod the
controller has just released (pinned to a node, gate lifted) holds its
instance before the agent ever sees a process on it. Per node and profile the
busy count is the larger of the pods claiming it and the instances the agent
reports in use, so neither a slow agent nor a slow scheduler makes the
controller hand one instance to two pods.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from controller.view import Gpu, Node, Pod, Snapshot


def mig_claims(pods: tuple[Pod, ...]) -> dict[str, Counter[str]]:
    """Node -> profile -> pods bound or pinned there that use such an instance."""
    out: dict[str, Counter[str]] = {}
    for pod in pods:
        if pod.mode == "mig" and pod.node is not None and not pod.gated:
            out.setdefault(pod.node, Counter()).update(pod.profiles)
    return out


def shared_claims(pods: tuple[Pod, ...]) -> Counter[str]:
    """Node -> shared replicas taken by pods bound or pinned there."""
    out: Counter[str] = Counter()
    for pod in pods:
        if pod.mode != "mig" and pod.node is not None and not pod.gated:
            out[pod.node] += pod.shares
    return out


def whole_pinned(pods: tuple[Pod, ...]) -> Counter[str]:
    """Node -> whole GPUs of gpupack pods pinned there and not bound yet (bound pods are in
    ``Node.whole_taken``, which counts every pod's ``nvidia.com/gpu``)."""
    out: Counter[str] = Counter()
    for pod in pods:
        if pod.mode == "whole" and pod.node is not None and not pod.gated and not pod.bound:
            out[pod.node] += pod.whole_gpus
    return out


def settled_gpus(node: Node) -> tuple[Gpu, ...]:
    """MIG-enabled GPUs whose reported instances are final (no reshape in flight)."""
    return tuple(g for g in node.gpus if g.mig_enabled and not g.reshaping)


def unreported_claims(node: Node, claims: Counter[str]) -> Counter[str]:
    """Per profile, pods on the node the agent has not (yet) reported as users."""
    reported = Counter(i.profile for g in node.gpus for i in g.in_use)
    return Counter({p: n - reported[p] for p, n in claims.items() if n > reported[p]})


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

    @classmethod
    def of(cls, snapshot: Snapshot) -> FreeCapacity:
        claims = mig_claims(snapshot.pods)
        taken = shared_claims(snapshot.pods)
        pinned = whole_pinned(snapshot.pods)
        ledger = cls()
        for node in snapshot.nodes:
            existing: Counter[str] = Counter()
            for gpu in settled_gpus(node):
                existing.update(gpu.offered)
            reported = Counter(i.profile for g in node.gpus for i in g.in_use)
            busy = claims.get(node.name, Counter())
            free = Counter({p: n - max(busy[p], reported[p]) for p, n in existing.items()})
            ledger.mig[node.name] = +free  # unary plus drops zero and negative counts
            future = Counter(existing)
            for gpu in node.gpus:
                if gpu.reshaping and gpu.desired is not None:
                    future.update(gpu.desired)
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
        return ledger

    def mig_free(self, node: str) -> Counter[str]:
        return self.mig.get(node, Counter())

    def take_mig(self, node: str, profiles: tuple[str, ...]) -> None:
        free = self.mig.setdefault(node, Counter())
        need = Counter(profiles)
        if any(free[p] < n for p, n in need.items()):
            raise ValueError(f"node {node} lacks free instances for {sorted(need.elements())}")
        free.subtract(need)

    def take_whole(self, node: str, gpus: int) -> None:
        if self.whole[node] < gpus:
            raise ValueError(f"node {node} has {self.whole[node]} free whole GPUs, {gpus} needed")
        self.whole[node] -= gpus

    def take_shared(self, node: str, shares: int) -> None:
        if self.shared[node] < shares:
            raise ValueError(f"node {node} has {self.shared[node]} free shared replicas, {shares} needed")
        self.shared[node] -= shares
