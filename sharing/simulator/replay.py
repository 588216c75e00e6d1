"""Replaying one workload onto a static cluster and aggregating runs over seeds.

Pods arrive one at a time and never leave; a pod that fits nowhere is dropped
(no retry, no preemption). Decision time is measured with an injected clock so
tests can run with a fake one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from sharing.packing.cluster import ClusterState
from sharing.packing.specs import NodeSpec, PodPlacement, PodSpec
from sharing.packing.policy import schedule
from sharing.packing.registry import canonical_policy_name, make_policy
from sharing.packing.typical import TypicalPods
from sharing.simulator.metrics import alloc_by_level, mean_levels
from sharing.simulator.arrivals import plan_run

Clock = Callable[[], int]
"""Nanosecond counter (``time.perf_counter_ns`` by default)."""


@dataclass(frozen=True)
class RunResult:
    """One seed's run."""

    policy: str
    seed: int
    pods: int
    failed_pods: int
    alloc_at: dict[int, float | None]
    decision_us_median: float
    final_alloc_percent: float


@dataclass(frozen=True)
class SweepResult:
    """Several seeds of one policy on one workload, averaged."""

    policy: str
    workload: str
    seeds: tuple[int, ...]
    alloc_at: dict[int, float | None]
    failed_pods: float
    decision_us_median: float
    runs: tuple[RunResult, ...]


def run_once(
    nodes: Sequence[NodeSpec],
    trace_pods: Sequence[PodSpec],
    policy_name: str,
    seed: int,
    inflate: float = 1.3,
    clock: Clock = time.perf_counter_ns,
    max_nodes: int | None = None,
) -> RunResult:
    """One (workload, seed, policy) run of the published protocol, on the seed's sample of
    ``max_nodes`` nodes when given (``sharing.simulator.arrivals.plan_run``)."""
    name = canonical_policy_name(policy_name)
    plan = plan_run(nodes, trace_pods, seed, inflate, max_nodes)
    ordered = plan.by_name
    total_gpus = plan.gpus
    workload = plan.workload
    typical = TypicalPods.from_pods(workload.originals)
    cluster = ClusterState(ordered, tie_rank=workload.tie_rank)
    # The generator continues after the workload draws, as in the published run.
    rng = np.random.default_rng(seed)
    policy = make_policy(name, rng=_continue_stream(rng, workload), typical=typical)
    arrived = np.zeros(len(workload.pods), dtype=np.int64)
    used = np.zeros(len(workload.pods), dtype=np.int64)
    times = np.zeros(len(workload.pods), dtype=np.int64)
    demand = allocated = failed = 0
    for i, pod in enumerate(workload.pods):
        start = clock()
        outcome = schedule(cluster, pod, policy)
        times[i] = clock() - start
        demand += pod.gpu_total_milli
        if isinstance(outcome, PodPlacement):
            allocated += pod.gpu_total_milli
        else:
            failed += 1
        arrived[i] = demand
        used[i] = allocated
    return RunResult(
        policy=name,
        seed=seed,
        pods=len(workload.pods),
        failed_pods=failed,
        alloc_at=alloc_by_level(arrived, used, total_gpus),
        decision_us_median=float(np.median(times)) / 1000.0,
        final_alloc_percent=100.0 * allocated / (total_gpus * 1000),
    )


def _continue_stream(rng: np.random.Generator, workload: object) -> np.random.Generator:
    # Random's draws come after the workload's; a generator derived from the seed
    # and a fixed spawn key keeps runs deterministic without replaying those draws.
    return np.random.default_rng([int(rng.integers(2**31)), 1])


def sweep(
    nodes: Sequence[NodeSpec],
    trace_pods: Sequence[PodSpec],
    workload_name: str,
    policy_name: str,
    seeds: Sequence[int],
    inflate: float = 1.3,
    clock: Clock = time.perf_counter_ns,
    max_nodes: int | None = None,
) -> SweepResult:
    """Run every seed (each on its own sample of ``max_nodes`` nodes when given) and average
    allocation per level, failures and decision time."""
    return summarise(
        tuple(run_once(nodes, trace_pods, policy_name, s, inflate, clock, max_nodes) for s in seeds), workload_name
    )


def summarise(runs: Sequence[RunResult], workload_name: str) -> SweepResult:
    """Several seeds' runs of one policy, averaged (allocation per level, failures, decision time)."""
    return SweepResult(
        policy=runs[0].policy,
        workload=workload_name,
        seeds=tuple(r.seed for r in runs),
        alloc_at=mean_levels([r.alloc_at for r in runs]),
        failed_pods=float(np.mean([r.failed_pods for r in runs])),
        decision_us_median=float(np.median([r.decision_us_median for r in runs])),
        runs=tuple(runs),
    )
