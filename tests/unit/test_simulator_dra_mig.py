"""The DRA model on MIG GPUs (``sharing.simulator.dra_mig``): gpupack's pinned choice against
kube-scheduler unguided, on partitionable devices."""

from __future__ import annotations

import pytest

from sharing.dra.mig_choice import MigGpu, choose
from mig.catalog import get_model
from mig.geometry import validate_layout
from mig.model import PlacedInstance
from sharing.packing.kube_scoring import MostAllocatedWeights
from sharing.packing.specs import NodeSpec, PodSpec
from sharing.simulator.dra_mig import DraMigReplay, first_fit, profiles_asked, run_dra_mig

H100 = get_model("H100-80GB")
WEIGHTS = MostAllocatedWeights(cpu=50, memory=50, gpu=1, gpu_shared=1)


def pod(name: str, milli: int, count: int = 1, cpu: int = 1000) -> PodSpec:
    return PodSpec(name, cpu, 1024, count, milli)


def mig_nodes(gpus: list[int], cpu: list[int] | None = None) -> list[NodeSpec]:
    cpus = cpu or [64_000] * len(gpus)
    return [NodeSpec(f"n{i}", c, 256_000, g, "T4") for i, (g, c) in enumerate(zip(gpus, cpus))]


def test_a_pod_asks_the_variants_profiles() -> None:
    assert profiles_asked(pod("cpu", 0, count=0), H100) == ()
    assert profiles_asked(pod("whole", 1000, count=2), H100) == ("7g.80gb", "7g.80gb")
    assert profiles_asked(pod("small", 100), H100) == ("1g.10gb",)
    assert profiles_asked(pod("some", 400), H100) == ("3g.40gb",)
    # Half a GPU asks half of the full profile's memory, more than 4g.40gb has: the whole GPU.
    assert profiles_asked(pod("half", 500), H100) == ("7g.80gb",)


def test_first_fit_takes_gpu_0_first_and_the_highest_start_first() -> None:
    layouts: list[list[PlacedInstance]] = [[], []]
    picks = first_fit(H100, layouts, ["1g.10gb", "1g.10gb", "7g.80gb"])
    assert picks is not None
    assert [(g, i.profile, i.placement.start) for g, i in picks] == [(0, "1g.10gb", 6), (0, "1g.10gb", 5),
                                                                     (1, "7g.80gb", 0)]
    assert layouts == [[], []]  # a trial: nothing committed
    assert first_fit(H100, [[PlacedInstance("7g.80gb", H100.profile("7g.80gb").placements[0])]], ["1g.10gb"]) is None


def test_unguided_goes_where_kube_scheduler_scores_the_node_best_the_engine_where_the_gpus_fit_best() -> None:
    # n1's CPU is small: MostAllocated puts the pod there; the engine ranks the GPUs alike and
    # breaks the tie by node name.
    nodes = mig_nodes([1, 1], cpu=[64_000, 16_000])
    unguided = DraMigReplay(nodes, H100, WEIGHTS, "scheduler")
    engine = DraMigReplay(nodes, H100, WEIGHTS, "engine")
    assert [(n, g, i.profile, i.placement.start) for n, g, i in unguided.place(pod("a", 100, cpu=8000)) or []] == \
        [("n1", 0, "1g.10gb", 6)]
    placed = engine.place(pod("a", 100, cpu=8000))
    assert placed is not None and placed[0][0] == "n0"
    # The engine's placement is the controller's own choice (sharing.dra.mig_choice.choose) on that GPU.
    own = choose([MigGpu("n0", 0, H100, [], [], lambda p: True)], "1g.10gb")
    assert own is not None and placed[0][2] == own[1]


def test_the_engine_fills_the_gpu_it_started_and_never_overlaps() -> None:
    replay = DraMigReplay(mig_nodes([2, 2]), H100, WEIGHTS, "engine")
    for i in range(7):
        assert replay.place(pod(f"p{i}", 100)) is not None
    layouts = replay.gpus.layouts
    assert sum(len(layout) for node in layouts for layout in node) == 7
    assert sorted(len(layout) for node in layouts for layout in node) == [0, 0, 0, 7]  # best fit: one GPU
    for node in layouts:
        for layout in node:
            assert validate_layout(H100, layout) is None
    assert replay.place(pod("whole", 1000, count=2)) is not None  # the node with two untouched GPUs
    assert replay.place(pod("more", 1000, count=2)) is None


@pytest.mark.parametrize("gpu_pods", ["engine", "scheduler"])
def test_cpu_bounds_and_pods_without_gpus(gpu_pods: str) -> None:
    replay = DraMigReplay(mig_nodes([1], cpu=[4000]), H100, WEIGHTS, gpu_pods)  # type: ignore[arg-type]
    assert replay.place(pod("cpu", 0, count=0, cpu=3000)) == []
    assert replay.place(pod("gpu", 100, cpu=2000)) is None  # GPU room, no CPU
    assert replay.place(pod("gpu", 100, cpu=1000)) is not None


def test_runs_count_the_milli_asked_and_the_slices_held_and_refuse_an_unknown_placer() -> None:
    nodes = mig_nodes([2, 2, 4, 1], cpu=[24_000] * 4)
    trace = [pod(f"p{i:02d}", m, cpu=2000) for i, m in enumerate([1000, 500, 250, 810, 470, 130, 70] * 3)]
    for gpu_pods in ("engine", "scheduler"):
        run = run_dra_mig(nodes, trace, H100, 7, WEIGHTS, gpu_pods)  # type: ignore[arg-type]
        assert run.pods > len(trace) and 0 < run.failed_pods < run.pods  # tuned to 130 %: some never fit
        top = max(k for k, v in run.alloc_at.items() if v is not None)
        assert run.occupied_at[top] is not None and run.alloc_at[top] is not None
        assert run.occupied_at[top] >= run.alloc_at[top]  # an instance holds at least what its pod asked
    with pytest.raises(ValueError, match="engine, scheduler"):
        DraMigReplay(nodes, H100, WEIGHTS, "first-fit")  # type: ignore[arg-type]
