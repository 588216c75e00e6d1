"""The ``Policy`` protocol and the decision loop every policy shares.

A policy scores the feasible nodes for one pod (higher is better) and, once a
node is chosen, picks the GPUs on it. The engine does the rest the same way for
every policy: filter, score, take the maximum, break ties by the cluster's
``tie_rank`` (smallest wins; the published simulator's patched kube-scheduler
uses the lexicographically smallest rank-prefixed node name), commit.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from sharing.packing.cluster import BoolArray, ClusterState, IntArray
from sharing.packing.specs import GPU_MILLI, PodPlacement, PodSpec, Refusal


class Policy(Protocol):
    """Node scoring plus GPU choice inside the chosen node."""

    name: str

    def scores(self, cluster: ClusterState, pod: PodSpec, nodes: IntArray) -> npt.NDArray[np.float64] | IntArray:
        """Score of each node in ``nodes`` (all feasible, at least two) for ``pod``; higher wins."""
        ...

    def choose_gpus(self, cluster: ClusterState, pod: PodSpec, node: int) -> tuple[int, ...]:
        """Devices of ``node`` that ``pod`` uses (``pod.gpu_count`` of them; none for CPU-only pods)."""
        ...


def first_free_gpus(cluster: ClusterState, pod: PodSpec, node: int) -> tuple[int, ...]:
    """Whole-GPU pods: the ``q`` lowest-indexed fully free devices."""
    row = cluster.gpu_free[node]
    return tuple(int(j) for j in np.flatnonzero(row == GPU_MILLI)[: pod.gpu_count])


def best_fit_gpu(cluster: ClusterState, pod: PodSpec, node: int) -> tuple[int, ...]:
    """The published "best" GPU selector: whole pods take the first free devices;
    a fractional pod takes the device with the least free milli that still fits
    it (lowest index on ties), which may be a fully free device."""
    if pod.gpu_count == 0:
        return ()
    if pod.is_whole:
        return first_free_gpus(cluster, pod, node)
    row = cluster.gpu_free[node]
    fits = np.where(row >= pod.gpu_milli, row, GPU_MILLI + 1)
    return (int(np.argmin(fits)),)


def decide(
    cluster: ClusterState, pod: PodSpec, policy: Policy, allowed: BoolArray | None = None
) -> PodPlacement | Refusal:
    """Where ``policy`` would put ``pod`` now, without committing it.

    ``allowed`` narrows the candidates to a subset of the nodes (a caller's own
    rules: free replicas, a pinned node, node selectors). It is a mask, never a
    change to the state: a policy's state cache must only ever see true states.
    """
    feasible = cluster.feasible(pod)
    nodes = np.flatnonzero(feasible if allowed is None else feasible & allowed)
    if nodes.size == 0:
        if allowed is not None and feasible.any():
            return Refusal(pod=pod, reasons=(f"{int(feasible.sum())} feasible nodes, none allowed by the caller",))
        return Refusal(pod=pod, reasons=cluster.refusal_reasons(pod))
    if nodes.size == 1:
        node = int(nodes[0])  # the only candidate is taken without scoring
    else:
        scores = policy.scores(cluster, pod, nodes)
        tied = nodes[scores == scores.max()]
        node = int(tied[np.argmin(cluster.tie_rank[tied])]) if tied.size > 1 else int(tied[0])
    return PodPlacement(pod=pod, node=node, gpus=policy.choose_gpus(cluster, pod, node))


def schedule(cluster: ClusterState, pod: PodSpec, policy: Policy) -> PodPlacement | Refusal:
    """Decide and commit: the pod's resources are taken from the chosen node."""
    outcome = decide(cluster, pod, policy)
    if isinstance(outcome, PodPlacement):
        return cluster.place(pod, outcome.node, outcome.gpus)
    return outcome
