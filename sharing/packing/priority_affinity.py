"""Keep pods of different priorities off each other's nodes: the engine's placement preference by priority.

A node whose GPU pods are all of lower priority than a waiting pod can be reclaimed whole for it
(``sharing.packing.preemption``'s *reshape*: a node's replica count is node-wide, so a shared node
is only free for a whole-GPU pod once every replica pod on it is gone). A node that holds a
high-priority replica beside best-effort ones cannot: no pod may preempt the high one. So when the
engine places a GPU pod it first looks among the nodes that hold no GPU pod of another priority
(:func:`unmixed_nodes`), and only when none of those has room among all of them; the caller runs
its own placement twice, with and without the mask, and a run without priorities is unchanged.

:func:`unmixed_among` is the rule itself, over the GPU pods as (node, priority) pairs: the product
model applies it to its ``PlacedPods`` (:func:`unmixed_nodes`), the live planner to the snapshot's
pods and its own releases (``controller.planning.sharedplan.SharedPlacer``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sharing.packing.cluster import BoolArray, IntArray
from sharing.packing.victims import PlacedPods

# Two preferences, one module. The engine keeps every GPU pod it places to nodes of its own priority
# (``unmixed``): best-effort replicas then sit on nodes a whole-GPU pod can reclaim whole. kube-scheduler's
# pods (through gpupack's prioritize extender) keep only off nodes holding GPU pods they outrank
# (``no_lower``): a high pod there would pin down a node a larger high pod could later reclaim, while a
# best-effort pod takes the gaps wherever MostAllocated finds them. Measured in the product model on
# openb (docs/priority.md, "kube-scheduler's pods"): ``no_lower`` for kube-scheduler's pods meets the
# high-placed targets with 26-35 % less paired preempted milli than kube-scheduler's default;
# ``unmixed`` for them too placed slightly more high milli but preempted more (14-20 % less only).


def unmixed_nodes(placed: PlacedPods, priority: int) -> BoolArray:
    """Per node, whether every GPU pod placed there has ``priority`` (true for a node without GPU pods).

    CPU-only pods do not count: kube-scheduler places them anywhere, and preemption takes them
    beside the GPU pods of a node it reclaims when they are of lower priority."""
    gpu_rows = placed.alive & placed.gpu_pod
    return unmixed_among(placed.node[gpu_rows], placed.priority[gpu_rows], placed.node_count, priority)


def unmixed_among(nodes: IntArray, priorities: IntArray, node_count: int, priority: int) -> BoolArray:
    """Per node of ``node_count``, whether every GPU pod there has ``priority``: GPU pod ``k`` is on
    node ``nodes[k]`` with priority ``priorities[k]`` (a node without GPU pods: true)."""
    return _holding_none(nodes, priorities, node_count, lambda held: held != priority)


def no_lower_nodes(placed: PlacedPods, priority: int) -> BoolArray:
    """Per node, whether no GPU pod placed there has a priority below ``priority`` (true for a node
    without GPU pods): the preference kube-scheduler's pods get through gpupack's prioritize extender.
    CPU-only pods do not count, as in :func:`unmixed_nodes`."""
    gpu_rows = placed.alive & placed.gpu_pod
    return no_lower_among(placed.node[gpu_rows], placed.priority[gpu_rows], placed.node_count, priority)


def no_lower_among(nodes: IntArray, priorities: IntArray, node_count: int, priority: int) -> BoolArray:
    """Per node of ``node_count``, whether no GPU pod there has a priority below ``priority``: GPU pod
    ``k`` is on node ``nodes[k]`` with priority ``priorities[k]`` (a node without GPU pods: true)."""
    return _holding_none(nodes, priorities, node_count, lambda held: held < priority)


def _holding_none(nodes: IntArray, priorities: IntArray, node_count: int,
                  against: Callable[[IntArray], BoolArray]) -> BoolArray:
    """Per node of ``node_count``, whether no GPU pod there has a priority ``against`` marks (both rules'
    one body: they differ only in which priorities count against a node)."""
    if len(nodes) != len(priorities):
        raise ValueError(f"{len(nodes)} pod nodes but {len(priorities)} pod priorities: one of each per GPU pod")
    out: BoolArray = np.bincount(nodes[against(priorities)], minlength=node_count) == 0
    return out
