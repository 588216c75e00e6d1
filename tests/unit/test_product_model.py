"""The simulator's product model on hand-made clusters where each live rule's effect is known."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from sharing.packing.cluster import ClusterState
from sharing.packing.fgd import FgdPolicy
from sharing.packing.gpupack_policy import GpupackPolicy
from sharing.packing.kube_scoring import MostAllocatedWeights
from sharing.packing.specs import NodeSpec, PodSpec
from sharing.packing.node_sharing import FRESH, WHOLE, least_feedable, most_feedable, switch_choice, switch_for, waste_first
from sharing.packing.typical import TypicalPods
from sharing.rules.replicas import fits_replicas, largest_replicas, takes_whole_gpu
from sharing.simulator.product import LivePath, ProductReplay
from sharing.simulator.scheduler_config import SHIPPED_CONFIG, SchedulerConfigError, load_weights

WEIGHTS = MostAllocatedWeights(cpu=1, memory=1, gpu=10, gpu_shared=10)


def gpu_pod(name: str, milli: int, count: int = 1, cpu: int = 1000) -> PodSpec:
    return PodSpec(name, cpu, 1024, count, milli)


def replay(gpus: list[int], path: LivePath = "engine", cpu: int = 64_000, policy: str = "FGD") -> ProductReplay:
    nodes = [NodeSpec(f"n{i}", cpu, 256_000, g, "T4") for i, g in enumerate(gpus)]
    cluster = ClusterState(nodes)
    typical = TypicalPods.from_pods([gpu_pod("t1", 300), gpu_pod("t2", 1000)])
    chosen = FgdPolicy(typical) if policy == "FGD" else GpupackPolicy(typical)
    return ProductReplay(cluster, chosen, WEIGHTS, path)


def test_the_replica_rule() -> None:
    assert fits_replicas(3, 333, None, 0) and not fits_replicas(4, 300, None, 0)
    assert fits_replicas(2, 400, 20 * 2**30, 40 * 2**30) and not fits_replicas(2, 400, 21 * 2**30, 40 * 2**30)
    assert [largest_replicas(m) for m in (50, 125, 126, 300, 334, 500, 501)] == [8, 8, 7, 3, 2, 2, 1]
    assert takes_whole_gpu(501) and not takes_whole_gpu(500)
    with pytest.raises(ValueError, match="positive"):
        largest_replicas(0)


def test_a_600_milli_pod_takes_a_whole_gpu_on_the_engine_path() -> None:
    r = replay([2])
    assert r.place(gpu_pod("big", 600)) == 1000.0
    assert r.modes[0] == WHOLE and r.cluster.full_count[0] == 1
    # A whole-GPU node takes no replica: the next small pod has nowhere to go.
    assert r.place(gpu_pod("small", 300)) is None


def test_a_600_milli_pod_splits_a_node_into_one_replica_on_the_scheduler_path() -> None:
    r = replay([2], path="scheduler")
    assert r.place(gpu_pod("big", 600)) == 1000.0
    assert r.modes[0] == 1
    assert r.place(gpu_pod("whole", 1000)) is None  # a shared node never takes a whole-GPU pod


def test_a_300_milli_pod_never_lands_on_an_r4_node() -> None:
    r = replay([2, 2])
    assert r.place(gpu_pod("quarter", 250)) == 250.0  # the smallest node splits into 4
    four = int(np.flatnonzero(r.modes == 4)[0])
    assert r.place(gpu_pod("third", 300)) == pytest.approx(1000 / 3)
    assert r.modes[1 - four] == 3
    r.place(gpu_pod("third-2", 300))
    assert r.used[four].sum() == 1  # still only the quarter on the r = 4 node


def test_a_shared_pod_goes_where_it_wastes_the_least() -> None:
    r = replay([1, 1, 1])
    r.place(gpu_pod("a", 450))  # r = 2
    r.place(gpu_pod("b", 240))  # a free replica on a shared node beats splitting an idle node
    assert sorted(int(m) for m in r.modes) == [0, 0, 2]
    r2 = replay([1, 1, 1])
    r2.modes[:] = [2, 4, FRESH]
    assert r2.place(gpu_pod("c", 200)) == 250.0  # k = 5: the r = 4 node, not the r = 2 one
    assert r2.used[1].sum() == 1 and r2.used[0].sum() == 0


def test_gpupack_splits_an_idle_node_before_it_wastes_a_larger_replica() -> None:
    r = replay([1, 1, 1], policy="gpupack")
    r.modes[:] = [2, 4, FRESH]
    r.used[:2, 0] = 1
    assert r.place(gpu_pod("c", 200)) == 200.0  # k = 5: the idle node split into 5, not a quarter
    assert r.modes.tolist() == [2, 4, 5]
    assert r.place(gpu_pod("d", 200)) == 200.0  # a replica of its own size now exists
    assert r.used.sum(axis=1).tolist() == [1, 1, 2]
    assert r.place(gpu_pod("e", 300)) == 500.0  # k = 3, no idle node: a larger replica (r = 4 would not hold it)
    assert r.used.sum(axis=1).tolist() == [2, 1, 2]


def test_gpupack_takes_a_larger_replica_rather_than_split_a_large_node() -> None:
    r = replay([1, 8], policy="gpupack")
    r.modes[:] = [4, FRESH]
    r.used[0, 0] = 1
    # k = 5: the only idle node would hold 8 x 5 = 40 replicas, more than a small split's 16.
    assert r.place(gpu_pod("c", 200)) == 250.0
    assert r.modes.tolist() == [4, FRESH] and r.used[0, 0] == 2
    r.used[0, 0] = 4  # no larger replica left: now the large node is split
    assert r.place(gpu_pod("d", 200)) == 200.0
    assert r.modes.tolist() == [4, 5]


def test_whole_gpu_pods_never_land_on_shared_nodes() -> None:
    r = replay([4, 4])
    r.place(gpu_pod("s", 300))
    shared = int(np.flatnonzero(r.modes > 0)[0])
    assert r.place(gpu_pod("w", 1000, count=2)) == 2000.0
    assert r.modes[1 - shared] == WHOLE
    assert r.place(gpu_pod("w2", 1000, count=4)) is None


def test_cpu_only_pods_are_scored_by_most_allocated() -> None:
    r = replay([1, 1])
    r.place(PodSpec("first", 8000, 1024))
    first = int(np.flatnonzero(r.cluster.cpu_free < r.cluster.cpu_total)[0])
    r.place(PodSpec("second", 8000, 1024))
    assert r.cluster.cpu_free[first] == r.cluster.cpu_total[first] - 16000  # packed, not spread


def test_waste_first_and_switch_rules() -> None:
    modes = np.array([2, 4, 4, FRESH], dtype=np.int64)
    assert list(waste_first(np.array([True, True, False, False]), modes)) == [False, True, False, False]
    assert not waste_first(np.zeros(4, dtype=bool), modes).any()
    counts = np.array([8, 2, 2, 4], dtype=np.int64)
    ranks = np.array([0, 3, 1, 2], dtype=np.int64)
    assert switch_choice(np.ones(4, dtype=bool), counts, ranks) == 2
    assert switch_choice(np.zeros(4, dtype=bool), counts, ranks) is None


def test_gpupack_switches_the_node_whose_cpu_feeds_its_replicas() -> None:
    nodes = [NodeSpec("small-cpu-poor", 4000, 64_000, 2, "T4"), NodeSpec("big", 64_000, 256_000, 4, "T4")]
    cluster = ClusterState(nodes)
    typical = TypicalPods.from_pods([gpu_pod("t", 250, cpu=4000)])
    candidates = np.ones(2, dtype=bool)
    assert np.flatnonzero(most_feedable(cluster, candidates, 4, 4000.0)).tolist() == [1]
    assert switch_for(GpupackPolicy(typical), cluster, gpu_pod("p", 250), candidates, 4) == 1
    assert switch_for(FgdPolicy(typical), cluster, gpu_pod("p", 250), candidates, 4) == 0  # fewest GPUs


def test_the_typical_pods_a_whole_gpu_node_can_take() -> None:
    typical = TypicalPods.from_pods([gpu_pod("s", 300), gpu_pod("s2", 300), gpu_pod("w", 1000), PodSpec("c", 2000, 1024)])
    whole = typical.without_shared()
    assert sorted(zip(whole.gpu_milli, whole.probability)) == [(0, 0.5), (1000, 0.5)]
    only_shared = TypicalPods.from_pods([gpu_pod("s", 300)])
    assert only_shared.without_shared() is only_shared  # nothing else typical: the table stays


def test_gpupack_gives_whole_gpu_pods_nodes_in_use_then_the_worst_fed_idle_node() -> None:
    nodes = [NodeSpec("in-use", 64_000, 256_000, 2, "T4"), NodeSpec("rich", 96_000, 256_000, 4, "T4"),
             NodeSpec("poor", 6_000, 256_000, 4, "T4")]
    typical = TypicalPods.from_pods([gpu_pod("t", 300, cpu=4000)] * 3 + [gpu_pod("w", 1000)])
    r = ProductReplay(ClusterState(nodes), GpupackPolicy(typical), WEIGHTS, "engine")
    # Pods above half a GPU are the engine's whole-GPU pods (plain whole-GPU pods are kube-scheduler's).
    r.place(gpu_pod("first", 600))  # every node idle: the one whose CPU feeds the fewest replicas
    assert r.modes.tolist() == [FRESH, FRESH, WHOLE]
    for i in range(3):  # whole-GPU nodes in use beat idle ones while they have a GPU
        r.place(gpu_pod(f"more-{i}", 600))
    assert r.modes.tolist() == [FRESH, FRESH, WHOLE] and int((r.cluster.gpu_free[2] == 0).sum()) == 4
    r.place(gpu_pod("fifth", 600))  # none in use fits: the worse fed of the two idle nodes
    assert r.modes.tolist() == [WHOLE, FRESH, WHOLE]
    # FGD scores every candidate alike: its first whole-GPU pod takes another node.
    fgd = ProductReplay(ClusterState(nodes), FgdPolicy(typical), WEIGHTS, "engine")
    fgd.place(gpu_pod("first", 600))
    assert fgd.modes[2] == FRESH
    # The CPU-poor node's leftover feeds 1 of 9 replicas of 300 milli; the others feed all theirs.
    every = np.ones(3, dtype=bool)
    assert least_feedable(ClusterState(nodes), gpu_pod("x", 1000), every, 3, 4000.0).tolist() == [False, False, True]
    assert not least_feedable(ClusterState(nodes), gpu_pod("x", 1000), ~every, 3, 4000.0).any()


def test_unknown_live_path_is_refused() -> None:
    with pytest.raises(ValueError, match="engine, scheduler"):
        replay([1], path="bogus")  # type: ignore[arg-type]


def test_weights_come_from_the_shipped_scheduler_config(tmp_path: Path) -> None:
    assert load_weights(SHIPPED_CONFIG) == MostAllocatedWeights(cpu=50, memory=50, gpu=1, gpu_shared=1)
    least = tmp_path / "least.yaml"
    least.write_text(SHIPPED_CONFIG.read_text().replace("type: MostAllocated", "type: LeastAllocated"))
    with pytest.raises(SchedulerConfigError, match="LeastAllocated"):
        load_weights(least)
    with pytest.raises(SchedulerConfigError, match="cannot read"):
        load_weights(tmp_path / "missing.yaml")


def test_every_openb_gpu_type_maps_to_a_product_without_mig() -> None:
    from mig.openb_gpus import OPENB_GPUS, openb_gpu

    assert set(OPENB_GPUS) == {"V100M16", "V100M32", "P100", "T4", "A10", "G2", "G3"}  # the node list's types
    assert not any(g.mig_capable for g in OPENB_GPUS.values())
    assert openb_gpu("T4").memory_mib == 16 * 1024
    with pytest.raises(ValueError, match="unknown openb GPU type"):
        openb_gpu("H100")


def test_present_typical_pods_are_the_placed_gpu_pods_and_the_arriving_one() -> None:
    """The live controller's rule (``controller.planning.sharedplan.typical_pods``): the GPU pods that exist,
    as the engine sees them (above half a GPU: a whole GPU); CPU-only pods are not GPU pods."""
    from sharing.simulator.product import PresentPods

    present = PresentPods("engine")
    first = present.with_arriving([gpu_pod("a", 200)])
    assert list(zip(first.gpu_milli, first.probability)) == [(200, 1.0)]
    present.placed(gpu_pod("a", 200))
    present.placed(PodSpec("cpu-only", 4000, 0))
    table = present.with_arriving([gpu_pod("b", 700), PodSpec("cpu", 100, 0)])
    assert sorted(zip(table.gpu_milli, table.probability)) == [(200, 0.5), (1000, 0.5)]
    assert present.with_arriving([PodSpec("cpu-only", 1000, 0)]).gpu_milli == (200,)


def test_an_unknown_typical_rule_is_refused() -> None:
    from sharing.simulator.product import run_product

    with pytest.raises(ValueError, match="unknown typical-pods rule 'future'"):
        run_product([NodeSpec("n", 1000, 1000, 1, "T4")], [gpu_pod("a", 100)], "gpupack", 42, WEIGHTS,
                    typical="future")  # type: ignore[arg-type]


def test_the_model_follows_the_prioritize_extender_as_the_file_configures_it(tmp_path: Path) -> None:
    from sharing.simulator.scheduler_config import load_priority_extender

    assert load_priority_extender(SHIPPED_CONFIG)
    config = yaml.safe_load(SHIPPED_CONFIG.read_text())
    config.pop("extenders")
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump(config))
    assert not load_priority_extender(bare)
    # Another extender (another verb or address) is not gpupack's.
    config["extenders"] = [{"urlPrefix": "https://other.example:443/filter", "filterVerb": "filter"}]
    bare.write_text(yaml.safe_dump(config))
    assert not load_priority_extender(bare)
    # A weight the plugins' scores can outrank: the model could not say where kube-scheduler places.
    weak = yaml.safe_load(SHIPPED_CONFIG.read_text())
    weak["extenders"][0]["weight"] = 5
    light = tmp_path / "light.yaml"
    light.write_text(yaml.safe_dump(weak))
    with pytest.raises(SchedulerConfigError, match="weight 5; below 17"):
        load_priority_extender(light)
