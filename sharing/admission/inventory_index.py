"""What the admission decision asks of a snapshot's nodes, worked out once per snapshot.

A decision (``sharing.admission.options``) asks questions of every node: which GPU counts a
MIG model comes in, whether some node of a model has the free instances a pod
needs, which shared nodes fit a request and have room, the most full GPUs any
node has. At fleet size (thousands of nodes of a few kinds) asking them node by
node costs milliseconds per question, and each new snapshot forgets the answers
(``sharing.admission.decision.DecisionMemo``); while pods start every few tens of
milliseconds, every admission would pay it.

A :class:`NodeIndex` answers them from the nodes grouped by what the questions
read, built in one pass over the nodes (``Inventory.index``, once per snapshot;
the webhook builds it before publishing the snapshot, off the request path). Each
answer equals the node-by-node one, because each question is monotone in what a
group keeps: the distinct values, the most free, the Pareto front of free
instances.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from mig.model import GpuModel


class IndexedNode(Protocol):
    """What the index reads of a node (``sharing.admission.inventory.NodeView``; a protocol, so that the
    inventory may import this module and not the other way round)."""

    @property
    def name(self) -> str: ...
    @property
    def product(self) -> str: ...
    @property
    def model(self) -> GpuModel | None: ...
    @property
    def sharing(self) -> str: ...
    @property
    def replicas(self) -> int: ...
    @property
    def gpus(self) -> tuple[object, ...]: ...
    @property
    def gpu_memory_mib(self) -> int: ...
    @property
    def full_gpus(self) -> int: ...
    @property
    def free_by_profile(self) -> tuple[tuple[str, int], ...]: ...
    @property
    def mig_room(self) -> bool: ...
    @property
    def shared_free(self) -> int: ...
    @property
    def shared_room(self) -> bool: ...


@dataclass(frozen=True)
class SharedGroup:
    """The nodes sharing their GPUs one way alike: same mode, replicas, GPU memory and product."""

    replicas: int
    gpu_memory_mib: int
    product: str
    nodes: tuple[IndexedNode, ...]
    """By name."""
    most_free: int
    """The most shared replicas free on one of them (``NodeView.shared_free``)."""
    room: bool
    """Some of them could hand out a replica once one is free (``NodeView.shared_room``)."""

    def first_name(self, free: int = 0) -> str:
        """The first name among its nodes with ``free`` shared replicas free ("" when none has)."""
        return next((n.name for n in self.nodes if n.shared_free >= free), "")


def _front(vectors: Iterable[tuple[tuple[str, int], ...]]) -> tuple[dict[str, int], ...]:
    """The distinct vectors no other covers (``a`` covers ``b`` when ``a[k] >= b[k]`` for every key of ``b``)."""
    # Largest totals first: a vector can only be covered by one of a total at least its own.
    ordered = sorted((dict(v) for v in set(vectors)), key=lambda v: -sum(v.values()))
    front: list[dict[str, int]] = []
    for v in ordered:
        if not any(all(f.get(k, 0) >= n for k, n in v.items()) for f in front):
            front.append(v)
    return tuple(front)


class NodeIndex:
    """The nodes of one snapshot (or pool), grouped for the decision's questions."""

    def __init__(self, nodes: tuple[IndexedNode, ...]) -> None:
        shapes: set[tuple[int, int]] = set()
        hosts: dict[str, set[int]] = {}
        free: dict[str, set[tuple[tuple[str, int], ...]]] = {}
        room: set[str] = set()
        groups: dict[tuple[str, int, int, str], list[IndexedNode]] = {}
        whole = False
        for node in nodes:
            full = node.full_gpus
            shapes.add((full, node.gpu_memory_mib))
            whole = whole or (node.sharing == "none" and full > 0)
            if node.model is not None:
                product = node.model.product
                hosts.setdefault(product, set()).add(len(node.gpus))
                free.setdefault(product, set()).add(node.free_by_profile)
                if node.mig_room:
                    room.add(product)
            if node.sharing in ("mps", "time-slicing") and node.replicas >= 1:
                groups.setdefault((node.sharing, node.replicas, node.gpu_memory_mib, node.product), []).append(node)
        self.full_gpu_shapes: tuple[tuple[int, int], ...] = tuple(sorted(shapes))
        """The distinct (full GPUs, GPU memory MiB) of the nodes."""
        self.most_full_gpus = max((full for full, _ in shapes), default=0)
        self.has_whole_gpu_nodes = whole
        """Some node does not share its GPUs and has one not in MIG mode (where whole-GPU pods go)."""
        self._hosts = {p: tuple(sorted(h)) for p, h in hosts.items()}
        self._free = {p: _front(v) for p, v in free.items()}
        self._room = frozenset(room)
        self._shared: dict[str, tuple[SharedGroup, ...]] = {"mps": (), "time-slicing": ()}
        for (mode, replicas, mib, product), members in sorted(groups.items()):
            members.sort(key=lambda n: n.name)
            group = SharedGroup(replicas, mib, product, tuple(members), max(n.shared_free for n in members),
                                any(n.shared_room for n in members))
            self._shared[mode] += (group,)

    def mig_host_gpus(self, product: str) -> tuple[int, ...]:
        """The distinct GPU counts of the nodes of a MIG model, ascending."""
        return self._hosts.get(product, ())

    def mig_free(self, product: str, need: Mapping[str, int]) -> bool:
        """Some node of the model has ``need`` (profile -> instances) free at once (``NodeView.free_instances``)."""
        return any(all(v.get(name, 0) >= n for name, n in need.items()) for v in self._free.get(product, ()))

    def mig_room(self, product: str) -> bool:
        """Some node of the model could hold a new MIG instance (``NodeView.mig_room``)."""
        return product in self._room

    def shared_groups(self, mode: str) -> tuple[SharedGroup, ...]:
        """The groups of nodes sharing GPUs by ``mode`` (``Inventory.shared_nodes``, grouped)."""
        return self._shared.get(mode, ())
