"""The DRA model on MIG GPUs (``sharing.simulator.dra_mig``): gpupack's pinned choice against
kube-scheduler unguided, on partitionable devices."""

from __future__ import annotations

import numpy as np
import pytest

from sharing.dra.mig_choice import CPU_AND_MEMORY_WEIGHTS, MigGpu, NodeLoad, choose, place_pod
from mig.catalog import get_model
from mig.geometry import validate_layout
from mig.model import PlacedInstance
from sharing.packing.kube_scoring import MostAllocatedWeights
from sharing.packing.specs import NodeSpec, PodSpec
from sharing.simulator.scheduler_config import load_weights
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


def test_unguided_goes_where_kube_scheduler_scores_the_node_best_the_engine_where_gpus_and_cpu_are_fullest() -> None:
    # n1's CPU is small: MostAllocated on CPU and memory puts the pod there. n0's GPU already holds a
    # 3g instance: with the MIG slices weighted 100, the engine scores n0 best and fills that GPU.
    nodes = mig_nodes([1, 1], cpu=[64_000, 16_000])
    unguided = DraMigReplay(nodes, H100, WEIGHTS, "scheduler")
    engine = DraMigReplay(nodes, H100, WEIGHTS, "engine")
    started = PlacedInstance("3g.40gb", H100.profile("3g.40gb").placements[0])
    for replay in (unguided, engine):
        replay.gpus.add(0, 0, started)
    assert [(n, g, i.profile, i.placement.start) for n, g, i in unguided.place(pod("a", 100, cpu=8000)) or []] == \
        [("n1", 0, "1g.10gb", 6)]
    placed = engine.place(pod("a", 100, cpu=8000))
    assert placed is not None and placed[0][0] == "n0"
    # The engine's placement is the controller's own choice (sharing.dra.mig_choice.choose) on that GPU.
    own = choose([MigGpu("n0", 0, H100, [started], [], lambda p: True)], "1g.10gb")
    assert own is not None and placed[0][2] == own[1]


def test_with_untouched_gpus_the_engine_takes_the_node_whose_cpu_is_fullest() -> None:
    nodes = mig_nodes([1, 1], cpu=[64_000, 16_000])
    placed = DraMigReplay(nodes, H100, WEIGHTS, "engine").place(pod("a", 100, cpu=8000))
    assert placed is not None and placed[0][0] == "n1"


@pytest.mark.parametrize("seed", range(6))
def test_the_models_fast_choice_is_the_controllers_place_pod(seed: int) -> None:
    """The model scores arrays and ranks one GPU per layout; the controller calls ``place_pod`` on
    every GPU. Random clusters and pods: both make the same choice at every step."""
    rng = np.random.default_rng(seed)
    count = int(rng.integers(3, 7))
    nodes = [NodeSpec(f"n{i}", int(rng.choice([8_000, 16_000, 32_000, 64_000])),
                      int(rng.choice([32_000, 128_000, 256_000])), int(rng.integers(1, 4)), "T4") for i in range(count)]
    replay = DraMigReplay(nodes, H100, WEIGHTS, "engine")
    for step in range(60):
        whole = rng.random() < 0.1
        milli = 1000 if whole else int(rng.choice([100, 150, 250, 400, 700]))
        asked = pod(f"p{step}", milli, count=int(rng.integers(1, 3)) if whole else 1,
                    cpu=int(rng.choice([500, 2000, 6000])))
        cpu_shape = PodSpec(asked.name, asked.cpu_milli, asked.memory_mib)
        c = replay.cluster
        room = c.feasible(cpu_shape)
        gpus = [replay.gpus.mig_gpu(n, g) for n in np.flatnonzero(room) for g in range(len(replay.gpus.layouts[n]))]
        loads = {replay.gpus.names[n]: NodeLoad(int(c.cpu_total[n] - c.cpu_free[n]), int(c.cpu_total[n]),
                                                int(c.mem_total[n] - c.mem_free[n]), int(c.mem_total[n]))
                 for n in range(count)}
        expected = place_pod(gpus, profiles_asked(asked, H100), loads, asked.cpu_milli, asked.memory_mib)
        got = replay.place(asked)
        want = None if expected is None else [(g.node, g.index, i) for g, i in expected]
        assert got == want, (step, got, want)


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


def test_the_node_rule_weighs_cpu_and_memory_as_the_shipped_scheduler_configuration() -> None:
    shipped = load_weights()
    assert (CPU_AND_MEMORY_WEIGHTS.cpu, CPU_AND_MEMORY_WEIGHTS.memory) == (shipped.cpu, shipped.memory)
