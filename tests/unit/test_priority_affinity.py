"""The engine's placement preference by priority (sharing.packing.priority_affinity) and the product
model placing by it (sharing.simulator.product, with priorities)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from sharing.packing.cluster import BoolArray, ClusterState
from sharing.packing.gpupack_policy import GpupackPolicy
from sharing.packing.kube_scoring import MostAllocatedWeights
from sharing.packing.node_sharing import FRESH, WHOLE
from sharing.packing.priority_affinity import no_lower_among, no_lower_nodes, unmixed_among, unmixed_nodes
from sharing.packing.specs import GPU_MILLI, NodeSpec, PodSpec
from sharing.packing.typical import TypicalPods
from sharing.packing.victims import PlacedPods, Victim
from sharing.simulator.product import ProductReplay

HIGH, LOW = 1000, 0


def test_which_nodes_hold_no_gpu_pod_of_another_priority() -> None:
    cluster = ClusterState([NodeSpec(f"n{i}", 64_000, 256_000, 2, "T4") for i in range(4)])
    placed = PlacedPods(4)

    def add(key: str, node: int, priority: int, gpus: tuple[int, ...]) -> None:
        pod = PodSpec(key, 1000, 1000, len(gpus), GPU_MILLI if gpus else 0)
        placed.add(Victim(key, priority, pod.gpu_total_milli, cluster.place(pod, node, gpus)))

    add("mixed-high", 0, HIGH, (0,))
    add("mixed-low", 0, LOW, (1,))
    add("high", 1, HIGH, (0,))
    add("low", 2, LOW, (0,))
    add("cpu-only-high", 3, HIGH, ())  # a CPU-only pod does not make a node mixed
    assert unmixed_nodes(placed, HIGH).tolist() == [False, True, False, True]
    assert unmixed_nodes(placed, LOW).tolist() == [False, False, True, True]
    placed.remove("mixed-high")  # a pod that left no longer counts
    assert unmixed_nodes(placed, LOW).tolist() == [True, False, True, True]


@pytest.mark.parametrize(("rule", "for_high", "for_low"), [
    # the engine's rule: no GPU pod of another priority
    (unmixed_among, [False, True, False, True], [False, False, True, True]),
    # kube-scheduler's through the extender: only GPU pods the pod outranks count against a node
    (no_lower_among, [False, True, False, True], [True, True, True, True]),
], ids=["unmixed", "no-lower"])
def test_the_rules_over_node_and_priority_pairs(rule: Callable[..., BoolArray], for_high: list[bool],
                                                for_low: list[bool]) -> None:
    """The form the live planner and the extender call: one (node, priority) pair per GPU pod."""
    nodes, priorities = np.array([0, 0, 1, 2], dtype=np.int64), np.array([HIGH, LOW, HIGH, LOW], dtype=np.int64)
    assert rule(nodes, priorities, 4, HIGH).tolist() == for_high
    assert rule(nodes, priorities, 4, LOW).tolist() == for_low
    with pytest.raises(ValueError, match="4 pod nodes but 3 pod priorities"):
        rule(nodes, priorities[:3], 4, HIGH)


class Run:
    """A product model on ``gpus`` T4 nodes that places by priority when ``prefer`` (the simulator's wiring)."""

    def __init__(self, gpus: list[int], prefer: bool) -> None:
        cluster = ClusterState([NodeSpec(f"n{i}", 64_000, 256_000, g, "T4") for i, g in enumerate(gpus)])
        typical = TypicalPods.from_pods([PodSpec("t1", 1000, 1024, 1, 300), PodSpec("t2", 1000, 1024, 1, 1000)])
        self.replay = ProductReplay(cluster, GpupackPolicy(typical), MostAllocatedWeights(1, 1, 10, 10), "engine")
        self.placed = PlacedPods(len(gpus))
        self.priority: dict[str, int] = {}
        if prefer:
            self.replay.prefer = lambda pod: unmixed_nodes(self.placed, self.priority[pod.name])

    def place(self, name: str, milli: int, priority: int) -> int | None:
        pod = PodSpec(name, 1000, 1024, 1, milli)
        self.priority[name] = priority
        if self.replay.place(pod) is None:
            return None
        placement = self.replay.last_placement
        assert placement is not None and self.replay.last_node is not None
        self.placed.add(Victim(name, priority, milli, placement, replica=self.replay.last_replica))
        return self.replay.last_node


def test_a_best_effort_replica_goes_to_a_node_of_its_own_first() -> None:
    plain, by_priority = Run([1, 1], prefer=False), Run([1, 1], prefer=True)
    for run in (plain, by_priority):
        assert run.place("high", 300, HIGH) == 0  # the node is split into 3
    # Without the preference the best-effort pod takes the free replica beside the high one;
    # with it, it splits the idle node, which a whole-GPU pod can later reclaim whole.
    assert plain.place("low", 300, LOW) == 0
    assert by_priority.place("low", 300, LOW) == 1
    assert by_priority.place("high-2", 300, HIGH) == 0  # high with high
    assert by_priority.place("low-2", 300, LOW) == 1
    assert by_priority.place("low-3", 300, LOW) == 1
    # Node 1 is full; node 0 has a free replica beside high pods only: a preference, not a refusal.
    assert by_priority.place("low-4", 300, LOW) == 0
    assert by_priority.place("high-3", 300, HIGH) is None  # nothing free anywhere


def test_whole_gpu_pods_the_engine_places_keep_to_their_priority_too() -> None:
    run = Run([2, 2], prefer=True)
    assert run.place("high", 600, HIGH) is not None  # above half a GPU: a whole GPU
    first = run.replay.last_node
    assert run.replay.modes[first] == WHOLE
    other = 1 - int(first or 0)
    assert run.replay.modes[other] == FRESH
    assert run.place("low", 600, LOW) == other  # not the free GPU beside the high pod
    assert run.place("high-2", 600, HIGH) == first
    assert np.array_equal(run.replay.modes, np.array([WHOLE, WHOLE]))


def _kube_run(scheduler_prefers: bool) -> Run:
    run = Run([3, 3], prefer=True)
    if scheduler_prefers:  # the simulator's wiring when the shipped configuration names the extender
        run.replay.scheduler_prefer = lambda pod: no_lower_nodes(run.placed, run.priority[pod.name])
    return run


def _whole(run: Run, name: str, priority: int, cpu: int = 1000) -> int | None:
    """An ``nvidia.com/gpu`` pod of one GPU: kube-scheduler places it (MostAllocated)."""
    pod = PodSpec(name, cpu, 1024, 1, GPU_MILLI)
    run.priority[name] = priority
    if run.replay.place(pod) is None:
        return None
    placement = run.replay.last_placement
    assert placement is not None and run.replay.last_node is not None
    run.placed.add(Victim(name, priority, GPU_MILLI, placement))
    return run.replay.last_node


@pytest.mark.parametrize("scheduler_prefers", [False, True])
def test_kube_schedulers_pods_keep_off_pods_they_outrank_with_the_extender(scheduler_prefers: bool) -> None:
    """gpupack's prioritize extender makes kube-scheduler look first among the nodes holding no GPU pod
    of lower priority; without it, MostAllocated sends the high pod beside the best-effort one."""
    run = _kube_run(scheduler_prefers)
    low_node = _whole(run, "low", LOW, cpu=32_000)  # the fuller node by CPU
    assert low_node is not None
    assert _whole(run, "high", HIGH) == (1 - low_node if scheduler_prefers else low_node)


def test_a_best_effort_pod_is_not_steered_and_the_preference_is_no_refusal() -> None:
    run = _kube_run(True)
    low_node = _whole(run, "low", LOW, cpu=32_000)
    assert low_node is not None
    high_node = 1 - low_node
    assert _whole(run, "high", HIGH, cpu=40_000) == high_node
    # The high node is now the fuller one (40 of 64 CPUs against 32): MostAllocated's choice for a low
    # pod, which the extender leaves alone (no pod of its node is of lower priority than it).
    assert _whole(run, "low-2", LOW) == high_node
    # Now both nodes hold a low pod: no node is preferred, MostAllocated decides (the fuller node's last
    # GPU, then the other): a preference, never a refusal.
    assert _whole(run, "high-2", HIGH) == high_node
    assert _whole(run, "high-3", HIGH) == low_node
