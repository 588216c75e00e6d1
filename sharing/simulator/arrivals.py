"""One run's arrival plan: the nodes it replays onto and the pods that arrive, in order.

``plan_run`` is the one place a run's nodes and arrival sequence come from:
``gpupack simulate`` (every model and backend, one seed or ``--seeds N``) calls
it, and so does anything that must see the same run, such as a live replay of
the trace (``gpupack replay``). Two callers with the same node list, pod list,
seed, inflation and ``max_nodes`` get equal plans.

**Node sample** (``max_nodes=K``). K of the node list's rows are drawn
uniformly without replacement, every row alike (a CPU-only row, ``gpu`` 0, is
drawn like any other: the simulator places CPU-only pods on such a node, and
openb's GPU node list has none). The draw uses its own generator,
``numpy.random.default_rng([seed, NODE_SAMPLE_KEY])``: a permutation of the
row indices whose first K, sorted, are kept, so the sample is in the node
list's order. The protocol's generator (``default_rng(seed)``, which shuffles,
tunes and ranks: ``sharing.simulator.workload``) never sees this draw. With no
``max_nodes``, or K at least the node count, nothing is drawn and the plan is
the whole cluster's, bit for bit the run the protocol describes.

**Arrivals** are ``build_workload`` on the sample: shuffled, then tuned to
``inflate`` times the *sample's* GPU capacity with the protocol's stop rule,
with a tie-break rank for each sampled node (PROTOCOL.md §2, the cluster being
the sample). So a run on a K-node sample is the run of the protocol on a
cluster of those K nodes: ``plan_run(nodes, pods, s, i, K)`` equals
``plan_run(plan.nodes, pods, s, i)`` except for the record of what was sampled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from mig.openb_gpus import openb_gpu
from sharing.packing.specs import NodeSpec, PodSpec
from sharing.simulator.workload import Workload, build_workload

NODE_SAMPLE_KEY: Final[int] = int.from_bytes(b"nodes", "big")
"""Second word of the node sample's seed, ``[seed, NODE_SAMPLE_KEY]``: a stream apart from the protocol's."""


@dataclass(frozen=True)
class RunPlan:
    """What one run replays: its nodes (node-list order) and its workload (arrival order, tie ranks)."""

    nodes: tuple[NodeSpec, ...]
    workload: Workload
    max_nodes: int | None
    """The ``max_nodes`` asked for (None: the whole cluster)."""
    cluster_nodes: int
    """Nodes in the node list the plan was drawn from."""

    @property
    def seed(self) -> int:
        return self.workload.seed

    @property
    def gpus(self) -> int:
        """GPUs of the plan's nodes: the capacity the arrivals were tuned to."""
        return sum(n.gpu_count for n in self.nodes)

    @property
    def by_name(self) -> list[NodeSpec]:
        """The plan's nodes by name: the order a run's cluster keeps, whose first node wins the
        engine's ties as the live controller's first node by name does."""
        return sorted(self.nodes, key=lambda n: n.name)

    @property
    def sampled(self) -> bool:
        """True when the plan runs on fewer nodes than the node list has."""
        return len(self.nodes) < self.cluster_nodes


def check_max_nodes(max_nodes: int | None) -> None:
    """ValueError unless ``max_nodes`` is None or a whole number of at least 1."""
    if max_nodes is None:
        return
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int):
        raise ValueError(f"max_nodes must be a whole number of nodes, got {max_nodes!r}")
    if max_nodes < 1:
        raise ValueError(f"max_nodes must be at least 1, got {max_nodes}")


def sample_nodes(nodes: Sequence[NodeSpec], seed: int, max_nodes: int | None = None) -> tuple[NodeSpec, ...]:
    """The seed's sample of ``max_nodes`` nodes, in the node list's order (module docstring); all of
    ``nodes`` when ``max_nodes`` is None or at least their number."""
    check_max_nodes(max_nodes)
    if max_nodes is None or max_nodes >= len(nodes):
        return tuple(nodes)
    picked = np.random.default_rng([seed, NODE_SAMPLE_KEY]).permutation(len(nodes))[:max_nodes]
    return tuple(nodes[int(i)] for i in np.sort(picked))


def plan_run(
    nodes: Sequence[NodeSpec],
    trace_pods: Sequence[PodSpec],
    seed: int,
    inflate: float = 1.3,
    max_nodes: int | None = None,
) -> RunPlan:
    """The nodes and arrivals of one (trace, seed) run, on a sample of ``max_nodes`` nodes when given.

    ValueError for ``max_nodes`` below 1, an empty node list, or a sample without GPUs (no
    capacity to scale the arrivals to)."""
    if not nodes:
        raise ValueError("the node list is empty")
    chosen = sample_nodes(nodes, seed, max_nodes)
    gpus = sum(n.gpu_count for n in chosen)
    if gpus == 0:
        raise ValueError(
            f"the seed-{seed} sample of {len(chosen)} node(s) has no GPUs; sample more nodes"
            if len(chosen) < len(nodes) else "the node list has no GPUs"
        )
    return RunPlan(
        nodes=chosen,
        workload=build_workload(trace_pods, len(chosen), gpus, seed, inflate),
        max_nodes=max_nodes,
        cluster_nodes=len(nodes),
    )


def refuse_mig_capable(nodes: Sequence[NodeSpec], replays: str) -> None:
    """ValueError naming the first MIG-capable GPU type (by name) among ``nodes``: a model that
    replays fractional pods as shares of full GPUs (``replays`` says what it replays) has no rule
    for MIG placements."""
    for gpu_type in sorted({n.gpu_model for n in nodes if n.gpu_count}):
        if openb_gpu(gpu_type).mig_capable:
            raise ValueError(f"GPU type {gpu_type!r} is MIG-capable: {replays}")
