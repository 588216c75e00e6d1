"""Victim choice (sharing.packing.preemption) on small hand-built states under node-wide replicas."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from sharing.api.priority import NEVER, PodPriority
from sharing.packing.cluster import ClusterState
from sharing.packing.node_sharing import FRESH, WHOLE
from sharing.packing.preemption import (
    REASON_GPUS,
    REASON_REPLICA,
    REASON_RESHAPE,
    REASON_SCHEDULER,
    PreemptionPlan,
    candidate_count,
    engine_preemption,
    scheduler_preemption,
)
from sharing.packing.specs import GPU_MILLI, NodeSpec, PodSpec
from sharing.packing.victim_order import plan_key, reprieve_key, victim_key
from sharing.packing.victims import PlacedPods, Victim

HIGH = PodPriority(1000)
LOW = 0


class State:
    """A cluster of ``gpus`` GPUs per node with node modes, replicas taken and the placed pods."""

    def __init__(self, gpus: list[int], cpu: int = 64_000) -> None:
        self.cluster = ClusterState([NodeSpec(f"n{i}", cpu, 256_000, g, "V100M32") for i, g in enumerate(gpus)])
        self.modes = np.full(len(gpus), FRESH, dtype=np.int64)
        self.used = np.zeros((len(gpus), self.cluster.width), dtype=np.int64)
        self.placed = PlacedPods(len(gpus))

    def replica(self, key: str, node: int, gpu: int, r: int, milli: int, priority: int = LOW, cpu: int = 1000,
                started: float = 0.0) -> Victim:
        """A pod of ``milli`` in a replica of ``gpu``, the node split into ``r``."""
        self.modes[node] = r
        self.used[node, gpu] += 1
        taken = int(self.cluster.gpu_free[node, gpu] - (r - self.used[node, gpu]) * GPU_MILLI // r)
        placement = self.cluster.place(PodSpec(key, cpu, 1000, 1, taken), node, (gpu,))
        victim = Victim(key, priority, milli, placement, replica=True, started=started)
        self.placed.add(victim)
        return victim

    def whole(self, key: str, node: int, gpus: tuple[int, ...], priority: int = LOW, cpu: int = 1000,
              started: float = 0.0) -> Victim:
        self.modes[node] = WHOLE
        placement = self.cluster.place(PodSpec(key, cpu, 1000, len(gpus), GPU_MILLI), node, gpus)
        victim = Victim(key, priority, GPU_MILLI * len(gpus), placement, started=started)
        self.placed.add(victim)
        return victim

    def cpu_pod(self, key: str, node: int, cpu: int, priority: int = LOW) -> Victim:
        placement = self.cluster.place(PodSpec(key, cpu, 1000), node, ())
        victim = Victim(key, priority, 0, placement)
        self.placed.add(victim)
        return victim

    def engine(self, pod: PodSpec, priority: PodPriority = HIGH, own: int = 0) -> PreemptionPlan | None:
        return engine_preemption(self.cluster, self.modes, self.used, self.placed, pod, priority, own)

    def scheduler(self, pod: PodSpec, priority: PodPriority = HIGH, own: int = 0) -> PreemptionPlan | None:
        return scheduler_preemption(self.cluster, self.modes, self.used, self.placed, pod, priority, own)


def keys(plan: PreemptionPlan | None) -> set[str]:
    assert plan is not None
    return {v.key for v in plan.victims}


SHARED_300 = PodSpec("p", 1000, 1000, 1, 300)  # own size 3
WHOLE_1 = PodSpec("w", 1000, 1000, 1, GPU_MILLI)


def full_r2_node(s: State, node: int, priorities: tuple[int, int] = (LOW, LOW), milli: tuple[int, int] = (400, 400)) -> None:
    for g in range(int(s.cluster.gpu_count[node])):
        s.replica(f"a{node}{g}", node, g, 2, milli[0], priorities[0])
        s.replica(f"b{node}{g}", node, g, 2, milli[1], priorities[1])


@pytest.mark.parametrize("victim_priority", [1000, 1001], ids=["equal", "higher"])
@pytest.mark.parametrize("choose", ["engine", "scheduler"])
def test_never_a_victim_of_equal_or_higher_priority(victim_priority: int, choose: str) -> None:
    s = State([1])
    full_r2_node(s, 0, (victim_priority, victim_priority))
    assert getattr(s, choose)(SHARED_300, own=3) is None


@pytest.mark.parametrize("choose", ["engine", "scheduler"])
def test_a_never_preemptor_preempts_nothing(choose: str) -> None:
    s = State([1])
    full_r2_node(s, 0)
    assert getattr(s, choose)(SHARED_300, PodPriority(1000, NEVER), own=3) is None
    assert getattr(s, choose)(SHARED_300, PodPriority(1000), own=3) is not None


def test_the_engine_takes_the_fewest_victims_then_the_least_milli() -> None:
    s = State([1, 1])
    full_r2_node(s, 0, milli=(450, 500))
    full_r2_node(s, 1, milli=(300, 400))
    plan = s.engine(SHARED_300, own=3)
    assert keys(plan) == {"a10"}  # one victim, the one of least milli (300 of the four)
    assert plan is not None and plan.node == 1 and plan.gpus == (0,) and plan.reason == REASON_REPLICA
    assert not plan.reshape


def test_the_engine_prefers_lower_priority_over_less_milli() -> None:
    s = State([1, 1])
    full_r2_node(s, 0, priorities=(5, 5), milli=(100, 100))
    full_r2_node(s, 1, priorities=(1, 1), milli=(500, 500))
    assert keys(s.engine(SHARED_300, own=3)) <= {"a10", "b10"}


def test_the_engine_prefers_a_place_the_preemptor_fills_exactly() -> None:
    # Both nodes offer one victim of 250 milli; on n1 the preemptor's own size (r = 3) frees exactly its replica.
    s = State([1, 1])
    s.replica("a", 0, 0, 2, 250)
    s.replica("b", 0, 0, 2, 450)
    for name in ("c", "d", "e"):
        s.replica(name, 1, 0, 3, 250 if name == "c" else 300)
    plan = s.engine(SHARED_300, own=3)
    assert plan is not None and plan.node == 1 and plan.exact and keys(plan) == {"c"}


def test_cpu_is_freed_too_and_reprieved_when_not_needed() -> None:
    s = State([1], cpu=10_000)
    s.replica("r", 0, 0, 3, 300, cpu=2000)
    s.replica("q", 0, 0, 3, 300, cpu=2000)
    s.cpu_pod("big", 0, 5000)
    s.cpu_pod("small", 0, 1000)
    pod = PodSpec("p", 4000, 1000, 1, 300)  # a free replica is left; CPU is short by 4000 - 0
    plan = s.engine(pod, own=3)
    assert keys(plan) == {"big"}  # one pod covers the CPU: no replica pod is preempted
    sched = s.scheduler(pod, own=3)
    # kube-scheduler removes every lower pod, then reprieves most important first (all equal: earliest
    # start, then key) while the pod still fits: what is left is what the reprieve could not give back.
    assert sched is not None and sched.reason == REASON_SCHEDULER
    freed = sum(v.placement.pod.cpu_milli for v in sched.victims)
    assert freed >= 4000


def test_the_engine_reshapes_a_node_kube_scheduler_cannot() -> None:
    # A whole-GPU pod and only a shared node whose replica pods are all of lower priority.
    s = State([2])
    s.replica("a", 0, 0, 4, 200)
    s.replica("b", 0, 1, 4, 200)
    assert s.scheduler(WHOLE_1) is None  # no reshaping: a shared node is never a candidate for a whole GPU
    plan = s.engine(WHOLE_1)
    assert plan is not None and plan.reshape and plan.reason == REASON_RESHAPE and keys(plan) == {"a", "b"}
    assert plan.gpus == (0,)


def test_no_reshape_when_a_gpu_pod_on_the_node_is_not_lower() -> None:
    s = State([2])
    s.replica("a", 0, 0, 4, 200)
    s.replica("keep", 0, 1, 4, 200, priority=1000)
    assert s.engine(WHOLE_1) is None


def test_whole_gpus_are_freed_by_whole_gpu_victims() -> None:
    s = State([2, 2])
    s.whole("x", 0, (0, 1))
    s.whole("y", 1, (0,))
    s.whole("z", 1, (1,))
    plan = s.engine(PodSpec("w2", 1000, 1000, 2, GPU_MILLI))
    assert keys(plan) == {"x"} and plan is not None and plan.reason == REASON_GPUS and plan.gpus == (0, 1)
    one = s.engine(WHOLE_1)
    assert one is not None and len(one.victims) == 1 and one.node == 1 and one.exact


def test_kube_scheduler_picks_the_node_by_its_order_of_rules() -> None:
    s = State([1, 1, 1])
    # n0: victim of priority 5; n1: two victims of priority 1; n2: one victim of priority 1, started latest.
    s.whole("n0", 0, (0,), priority=5)
    s.whole("n1a", 1, (0,), priority=1, started=1.0)
    s.cpu_pod("n1b", 1, 62_500, priority=1)
    s.whole("n2", 2, (0,), priority=1, started=9.0)
    s2 = State([1, 1])
    s2.whole("early", 0, (0,), priority=1, started=1.0)
    s2.whole("late", 1, (0,), priority=1, started=9.0)
    assert keys(s.scheduler(WHOLE_1)) == {"n2"}  # lowest highest priority (1), then smallest sum (1 < 2)
    assert keys(s2.scheduler(WHOLE_1)) == {"late"}  # all else equal: the latest start


def test_kube_scheduler_reprieves_the_most_important_first() -> None:
    s = State([1])
    s.replica("hi", 0, 0, 2, 400, priority=7)
    s.replica("lo", 0, 0, 2, 400, priority=3)
    plan = s.scheduler(SHARED_300, own=3)
    assert keys(plan) == {"lo"}  # "hi" is reprieved first; then one replica must still go: "lo"


def test_kube_scheduler_dry_runs_a_limited_number_of_candidates_from_an_offset() -> None:
    s = State([1] * 4)
    for n in range(4):
        s.whole(f"v{n}", n, (0,), started=float(n))
    # With every node examined the latest start (v3) wins; from offset 1 with 2 candidates only n1, n2 are seen.
    assert keys(s.scheduler(WHOLE_1)) == {"v3"}
    limited = scheduler_preemption(s.cluster, s.modes, s.used, s.placed, WHOLE_1, HIGH, offset=1, max_candidates=2)
    assert keys(limited) == {"v2"}
    assert candidate_count(1213) == 121 and candidate_count(500) == 100 and candidate_count(40) == 40


def test_a_fractional_preemptor_needs_its_own_size() -> None:
    s = State([1])
    full_r2_node(s, 0)
    with pytest.raises(ValueError, match="own replica size"):
        s.engine(SHARED_300)


def test_the_engine_never_takes_more_victims_than_an_exhaustive_search() -> None:
    """On random small nodes, the engine's count of victims is the least any subset achieves."""
    rng = np.random.default_rng(7)
    for _ in range(40):
        s = State([2], cpu=12_000)
        r = int(rng.integers(2, 5))
        for g in range(2):
            for j in range(r):
                s.replica(f"g{g}j{j}", 0, g, r, 100, priority=int(rng.integers(0, 3)), cpu=int(rng.integers(200, 1500)))
        pod = PodSpec("p", int(rng.integers(500, 6000)), 1000, 1, 1000 // r - 10)
        plan = s.engine(pod, PodPriority(2), own=r)
        lower = [v for v in s.placed.on_node(0) if v.priority < 2]
        best = None
        for size in range(len(lower) + 1):
            for subset in itertools.combinations(lower, size):
                cpu = int(s.cluster.cpu_free[0]) + sum(v.placement.pod.cpu_milli for v in subset)
                replica = any(v.replica for v in subset) or int(s.used[0].sum()) < 2 * r
                if cpu >= pod.cpu_milli and replica:
                    best = size
                    break
            if best is not None:
                break
        if best is None:
            assert plan is None or plan.reshape
        else:
            assert plan is not None and len(plan.victims) == best


def test_the_placed_pods_index() -> None:
    s = State([1, 1])
    v = s.replica("a", 1, 0, 2, 400)
    s.whole("b", 0, (0,), priority=9)
    assert "a" in s.placed and len(s.placed) == 2 and s.placed.on_node(1) == [v]
    assert list(s.placed.per_node(s.placed.below(5), s.placed.cpu)) == [0, 1000]
    with pytest.raises(ValueError, match="placed already"):
        s.placed.add(v)
    assert s.placed.remove("a") == v and "a" not in s.placed and s.placed.on_node(1) == []
    for i in range(100):  # the arrays grow past their first size
        s.placed.add(Victim(f"c{i}", 0, 0, v.placement))
    assert len(s.placed) == 101


def test_a_reshape_also_frees_the_cpu_the_preemptor_lacks_beside_the_gpu_pods() -> None:
    # The GPU pods a reshape must preempt free 4000 CPU; the pod needs 6000: a CPU-only pod must go too.
    s = State([2], cpu=8000)
    s.replica("a", 0, 0, 4, 200, cpu=2000)
    s.replica("b", 0, 1, 4, 200, cpu=2000)
    s.cpu_pod("c", 0, 4000)
    plan = s.engine(PodSpec("w", 6000, 1000, 1, GPU_MILLI))
    assert plan is not None and plan.reshape and keys(plan) == {"a", "b", "c"}


def test_one_order_for_victims_and_plans() -> None:
    """sharing.packing.victim_order: the engine's and the live ledger's one ranking rule."""
    candidates = [("b", 0, 500), ("a", 0, 500), ("c", -5, 900), ("d", 0, 100)]
    assert [k for k, p, m in sorted(candidates, key=lambda v: victim_key(v[1], v[2], v[0]))] == ["c", "d", "a", "b"]
    assert [k for k, p, m in sorted(candidates, key=lambda v: reprieve_key(v[1], v[2], v[0]))] == ["a", "b", "d", "c"]
    plans = {"two-low": plan_key([0, 0], 200), "one-high": plan_key([50], 900), "one-low-more": plan_key([0], 900),
             "one-low-inexact": plan_key([0], 100, exact=False), "one-low": plan_key([0], 100)}
    assert sorted(plans, key=plans.__getitem__) == ["one-low", "one-low-inexact", "one-low-more", "one-high", "two-low"]
    assert plan_key([], 0) < plan_key([-(2**31)], 0)
