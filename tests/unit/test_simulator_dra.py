"""The DRA backend's product model on hand-made clusters where each rule's effect is known."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

import sharing.simulator.dra as dra
import sharing.simulator.product as product
import sharing.simulator.arrivals as arrivals
from sharing.packing.cluster import ClusterState, IntArray
from sharing.packing.fgd import FgdPolicy
from sharing.packing.fragmentation import FloatArray
from sharing.packing.kube_scoring import MostAllocatedWeights
from sharing.packing.node_sharing import WHOLE
from sharing.packing.specs import NodeSpec, PodSpec
from sharing.packing.typical import TypicalPods
from sharing.simulator.arrivals import RunPlan
from sharing.simulator.dra import DraReplay, as_claimed, check_share_unit, claimed_milli, run_dra
from mig.openb_gpus import OpenbGpu
from sharing.simulator.product import ProductReplay, run_product
from sharing.simulator.replay import run_once
from sharing.simulator.workload import Workload

WEIGHTS = MostAllocatedWeights(cpu=50, memory=50, gpu=1, gpu_shared=1)


def gpu_pod(name: str, milli: int, count: int = 1, cpu: int = 1000) -> PodSpec:
    return PodSpec(name, cpu, 1024, count, milli)


def nodes(gpus: Sequence[int], cpu: int = 64_000) -> list[NodeSpec]:
    return [NodeSpec(f"n{i}", cpu, 256_000, g, "T4") for i, g in enumerate(gpus)]


TYPICAL = TypicalPods.from_pods([gpu_pod("t1", 300), gpu_pod("t2", 1000)])


def dra_replay(gpus: Sequence[int], unit: int = 50) -> DraReplay:
    return DraReplay(ClusterState(nodes(gpus)), FgdPolicy(TYPICAL), WEIGHTS, unit)


def plugin_replay(gpus: Sequence[int]) -> ProductReplay:
    return ProductReplay(ClusterState(nodes(gpus)), FgdPolicy(TYPICAL), WEIGHTS, "engine")


# ------------------------------------------------------------------ the share unit
@pytest.mark.parametrize(
    ("milli", "unit", "claimed"),
    [(120, 50, 150), (150, 50, 150), (1, 50, 50), (960, 50, 1000), (999, 1, 999), (120, 25, 125), (301, 100, 400)],
    ids=["up", "exact", "tiny", "to-whole", "unit-1", "unit-25", "unit-100"],
)
def test_a_share_is_rounded_up_to_the_request_policy_step(milli: int, unit: int, claimed: int) -> None:
    assert claimed_milli(milli, unit) == claimed


def test_only_fractional_pods_are_rounded() -> None:
    assert as_claimed(gpu_pod("a", 120), 50).gpu_milli == 150
    whole, multi, cpu = gpu_pod("w", 1000), gpu_pod("m", 1000, count=4), PodSpec("c", 4000, 1024)
    assert as_claimed(whole, 50) is whole and as_claimed(multi, 50) is multi and as_claimed(cpu, 50) is cpu
    # A share rounded up to the whole GPU claims the whole GPU.
    assert as_claimed(gpu_pod("b", 960), 50).is_whole


@pytest.mark.parametrize(
    ("unit", "message"),
    [(0, "must be 1..500 milli"), (1001, "must be 1..500 milli"), (1000, "must be 1..500 milli"), (300, "must divide 1000"), (-50, "must be 1..500 milli")],
    ids=["zero", "above-a-gpu", "a-whole-gpu", "not-a-divisor", "negative"],
)
def test_a_share_unit_must_divide_a_gpu(unit: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_share_unit(unit)
    with pytest.raises(ValueError, match=message):
        dra_replay([1], unit)


# ------------------------------------------------------------------ the rules
def test_two_300_milli_pods_share_a_gpu_without_a_node_wide_r() -> None:
    r = dra_replay([2])
    assert r.place(gpu_pod("a", 300)) == 300 and r.place(gpu_pod("b", 300)) == 300
    assert sorted(r.cluster.gpu_free[0].tolist()) == [400, 1000]  # one GPU holds both, the other stays whole
    # The device-plugin model needs the node split into r = 3 for the same two pods ...
    p = plugin_replay([2])
    p.place(gpu_pod("a", 300))
    p.place(gpu_pod("b", 300))
    assert p.modes[0] == 3
    # ... and a node already handing out a whole GPU takes no share there; under DRA its other GPU does.
    p2, r2 = plugin_replay([2]), dra_replay([2])
    for replay in (p2, r2):
        assert replay.place(gpu_pod("whole", 1000)) is not None
    assert p2.modes[0] == WHOLE and p2.place(gpu_pod("a", 300)) is None
    assert r2.place(gpu_pod("a", 300)) == 300 and r2.place(gpu_pod("b", 300)) == 300
    assert r2.gpu_modes() == {"shared": 1, "whole": 1, "idle": 0}


def test_a_600_and_a_400_milli_pod_share_one_gpu() -> None:
    r = dra_replay([1])
    assert r.place(gpu_pod("big", 600)) == 600 and r.place(gpu_pod("small", 400)) == 400
    assert r.cluster.gpu_free[0, 0] == 0 and r.gpu_modes() == {"shared": 1, "whole": 0, "idle": 0}
    # Under the device-plugin rules the 600 takes the whole GPU and the 400 finds nothing.
    p = plugin_replay([1])
    assert p.place(gpu_pod("big", 600)) == 1000.0 and p.place(gpu_pod("small", 400)) is None


def test_a_whole_gpu_pod_never_lands_on_a_gpu_with_a_share() -> None:
    r = dra_replay([2, 2])
    r.place(gpu_pod("a", 100))
    shared = np.argwhere(r.cluster.gpu_free < 1000)
    assert len(shared) == 1
    node, gpu = (int(x) for x in shared[0])
    # Three whole GPUs are left with nothing on them: three whole-GPU pods fit, a fourth does not,
    # though the shared GPU still has 900 milli free.
    for i in range(3):
        assert r.place(gpu_pod(f"w{i}", 1000)) == 1000
        assert not r.whole[node, gpu]
    assert r.place(gpu_pod("w3", 1000)) is None
    assert r.cluster.gpu_free[node, gpu] == 900
    # A multi-GPU pod needs GPUs with nothing on them too.
    r2 = dra_replay([2, 2])
    r2.place(gpu_pod("a", 50))
    shared_node = int(np.argwhere(r2.cluster.gpu_free < 1000)[0][0])
    assert r2.place(gpu_pod("pair", 1000, count=2)) == 2000
    assert r2.whole[1 - shared_node].all() and not r2.whole[shared_node].any()
    assert r2.place(gpu_pod("pair2", 1000, count=2)) is None


def test_a_share_never_lands_on_a_gpu_taken_whole() -> None:
    r = dra_replay([1])
    assert r.place(gpu_pod("whole", 1000)) == 1000
    assert r.place(gpu_pod("tiny", 10)) is None


def test_a_120_milli_pod_occupies_150_and_allocation_counts_120() -> None:
    r = dra_replay([1])
    assert r.place(gpu_pod("a", 120)) == 150
    assert r.cluster.gpu_free[0, 0] == 850
    # A whole run on one GPU of 120-milli pods: 6 claims of 150 fit (7 would need 1050).
    one = [NodeSpec("n0", 64_000, 256_000, 1, "T4")]
    run = run_dra(one, [gpu_pod(f"p{i}", 120, cpu=100) for i in range(4)], "FGD", 42, WEIGHTS, share_unit=50)
    assert run.final_alloc_percent == pytest.approx(72.0)
    assert run.split.requested == pytest.approx(72.0) and run.split.share_rounding == pytest.approx(18.0)
    assert run.split.free_on_shared_gpus == pytest.approx(10.0) and run.split.free_gpus == 0.0
    assert run.failed_pods == run.pods - 6
    assert all(o >= a for a, o in zip(run.alloc_at.values(), run.occupied_at.values()) if a is not None and o is not None)
    # Exact shares (a step of 1 milli) fit 8 of them.
    exact = run_dra(one, [gpu_pod(f"p{i}", 120, cpu=100) for i in range(4)], "FGD", 42, WEIGHTS, share_unit=1)
    assert exact.final_alloc_percent == pytest.approx(96.0) and exact.split.share_rounding == 0.0


def test_the_capacity_split_adds_up_to_the_cluster() -> None:
    r = dra_replay([2, 1])
    taken = [r.place(p) for p in (gpu_pod("a", 120), gpu_pod("b", 1000), gpu_pod("c", 430))]
    split = r.split(120 + 1000 + 430, sum(t for t in taken if t is not None))
    assert split.requested + split.share_rounding + split.free_on_shared_gpus + split.free_gpus == pytest.approx(100.0)
    assert split.share_rounding == pytest.approx(100 * (30 + 20) / 3000)


# ------------------------------------------------------------------ who places what
class RecordingFgd(FgdPolicy):
    """FGD that records the GPU milli of every pod it scores or places."""

    def __init__(self, typical: TypicalPods) -> None:
        super().__init__(typical)
        self.seen: list[int] = []

    def scores(self, cluster: ClusterState, pod: PodSpec, nodes: IntArray) -> FloatArray:
        self.seen.append(pod.gpu_milli)
        return super().scores(cluster, pod, nodes)

    def choose_gpus(self, cluster: ClusterState, pod: PodSpec, node: int) -> tuple[int, ...]:
        self.seen.append(pod.gpu_milli)
        return super().choose_gpus(cluster, pod, node)


def test_the_policy_and_its_typical_pods_see_the_rounded_share(monkeypatch: pytest.MonkeyPatch) -> None:
    built: dict[str, Any] = {}

    def make(name: str, *, rng: np.random.Generator, typical: TypicalPods) -> RecordingFgd:
        policy = built["policy"] = RecordingFgd(typical)
        built["typical"] = typical
        return policy

    monkeypatch.setattr(dra, "make_policy", make)
    pods = [gpu_pod("a", 120), gpu_pod("b", 330), gpu_pod("c", 1000), gpu_pod("d", 960), PodSpec("cpu", 2000, 1024)]
    run_dra(nodes([2, 2, 2]), pods, "FGD", 42, WEIGHTS, share_unit=50)
    assert set(built["typical"].gpu_milli) <= {0, 150, 350, 1000}
    seen = built["policy"].seen
    assert seen and all(m % 50 == 0 for m in seen)
    assert 0 not in seen  # CPU-only pods go to kube-scheduler, not to the engine


def test_cpu_only_pods_are_scored_by_kube_scheduler_or_by_the_engine() -> None:
    r = dra_replay([1, 1])
    r.cluster.place(PodSpec("busy", 40_000, 1024), 1, ())
    # MostAllocated: the CPU-only pod goes where CPU is already taken.
    assert r.place(PodSpec("cpu", 4000, 1024)) == 0 and r.cluster.cpu_free[1] == 64_000 - 44_000
    engine = DraReplay(ClusterState(nodes([1, 1])), RecordingFgd(TYPICAL), WEIGHTS, 50, "engine")
    engine.cluster.place(PodSpec("busy", 40_000, 1024), 1, ())
    assert engine.place(PodSpec("cpu", 4000, 1024)) == 0
    assert isinstance(engine.policy, RecordingFgd) and engine.policy.seen == [0, 0]
    with pytest.raises(ValueError, match="scheduler, engine"):
        DraReplay(ClusterState(nodes([1])), FgdPolicy(TYPICAL), WEIGHTS, 50, "random")  # type: ignore[arg-type]


TRACE = [gpu_pod(f"p{i:02d}", m, cpu=2000) for i, m in enumerate([1000, 500, 250, 810, 470, 1000, 320, 650, 130, 70] * 2)]
TRACE += [gpu_pod("multi", 1000, count=2, cpu=4000), PodSpec("cpu-a", 8000, 4096), PodSpec("cpu-b", 16000, 8192)]


def test_exact_shares_engine_cpu_pods_and_the_workloads_typical_pods_are_the_fgd_protocol() -> None:
    cluster = nodes([2, 2, 4, 1], cpu=24_000)
    for policy in ("gpupack", "FGD", "Random"):
        exact = run_dra(cluster, TRACE, policy, 7, WEIGHTS, share_unit=1, cpu_pods="engine", typical="workload")
        protocol = run_once(cluster, TRACE, policy, 7)
        assert exact.alloc_at == protocol.alloc_at and exact.failed_pods == protocol.failed_pods


def test_the_same_seed_gives_the_same_arrivals_under_both_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Workload] = {}

    def spy(module: Any, key: str) -> None:
        real = module.plan_run

        def wrapped(*args: Any, **kwargs: Any) -> RunPlan:
            plan: RunPlan = real(*args, **kwargs)
            seen[key] = plan.workload
            return plan

        monkeypatch.setattr(module, "plan_run", wrapped)

    spy(dra, "dra")
    spy(product, "device-plugin")
    cluster = nodes([2, 2, 4, 1], cpu=24_000)
    a = run_dra(cluster, TRACE, "gpupack", 11, WEIGHTS)
    b = run_product(cluster, TRACE, "gpupack", 11, WEIGHTS)
    assert seen["dra"] == seen["device-plugin"]
    assert a.pods == b.pods == len(seen["dra"].pods)
    # The arrived-demand levels are the same too: every level one run reports, the other does.
    assert [k for k, v in a.alloc_at.items() if v is None] == [k for k, v in b.alloc_at.items() if v is None]
    # Exact shares let the DRA model place at least as much as node-wide replicas on this trace.
    assert a.final_alloc_percent >= b.final_alloc_percent


def test_a_mig_capable_gpu_type_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arrivals, "openb_gpu", lambda model: OpenbGpu("NVIDIA-A100", 80 * 1024, mig_capable=True))
    with pytest.raises(ValueError, match="MIG-capable: the DRA model replays consumable-capacity shares only"):
        run_dra(nodes([1]), TRACE, "FGD", 42, WEIGHTS)


def test_runs_repeat() -> None:
    cluster = nodes([2, 2, 4, 1], cpu=24_000)
    first = run_dra(cluster, TRACE, "gpupack", 3, WEIGHTS, clock=lambda: 0)
    again = run_dra(cluster, TRACE, "gpupack", 3, WEIGHTS, clock=lambda: 0)
    assert first == again and first.share_unit == 50 and first.cpu_pods == "scheduler"


# ------------------------------------------------------------------ kube-scheduler unguided


def unguided(gpus: Sequence[int]) -> DraReplay:
    return DraReplay(ClusterState(nodes(gpus)), FgdPolicy(TYPICAL), WEIGHTS, 50, gpu_pods="scheduler")


def test_unguided_the_allocator_takes_the_first_devices_that_fit() -> None:
    r = unguided([4])
    assert r.place(gpu_pod("a", 600)) == 600 and r.place(gpu_pod("b", 300)) == 300  # both on GPU 0
    assert r.cluster.gpu_free[0].tolist() == [100, 1000, 1000, 1000]
    assert r.place(gpu_pod("c", 250)) == 250  # GPU 0 has 100 left: the next GPU in order
    assert r.cluster.gpu_free[0].tolist() == [100, 750, 1000, 1000]
    assert r.place(gpu_pod("pair", 1000, count=2)) == 2000  # the first two untouched GPUs
    assert r.cluster.gpu_free[0].tolist() == [100, 750, 0, 0] and r.whole[0].tolist() == [False, False, True, True]
    assert r.place(gpu_pod("d", 800)) is None  # no device has 800 left
    assert dra.first_fit_gpus(r.cluster, as_claimed(gpu_pod("e", 80), 50), 0) == (0,)  # 100 claimed: fits GPU 0
    assert dra.first_fit_gpus(r.cluster, as_claimed(gpu_pod("f", 120), 50), 0) == (1,)  # 150 claimed: it does not
    with pytest.raises(ValueError, match="no room"):
        dra.first_fit_gpus(r.cluster, gpu_pod("whole", 1000), 0)


def test_unguided_kube_scheduler_chooses_the_node_by_cpu_and_memory_alone() -> None:
    r = unguided([2, 2])
    r.cluster.place(PodSpec("busy", 40_000, 1024), 1, ())
    # MostAllocated: the GPU pod goes to the node whose CPU is taken, GPUs or not.
    assert r.place(gpu_pod("a", 300)) == 300
    assert r.cluster.gpu_free[1].tolist() == [700, 1000] and r.cluster.gpu_free[0].tolist() == [1000, 1000]
    # A pod its filter rules out everywhere is dropped.
    assert r.place(gpu_pod("big", 1000, count=3)) is None


def test_unguided_refuses_engine_placed_cpu_pods_and_unknown_placers() -> None:
    with pytest.raises(ValueError, match="kube-scheduler places the GPU pods unguided"):
        DraReplay(ClusterState(nodes([1])), FgdPolicy(TYPICAL), WEIGHTS, 50, "engine", "scheduler")
    with pytest.raises(ValueError, match="engine, scheduler"):
        DraReplay(ClusterState(nodes([1])), FgdPolicy(TYPICAL), WEIGHTS, 50, gpu_pods="kubelet")  # type: ignore[arg-type]


def test_an_unguided_run_consults_no_policy_and_reads_no_typical_pods() -> None:
    cluster = nodes([2, 2, 4, 1], cpu=24_000)
    runs = [run_dra(cluster, TRACE, policy, 5, WEIGHTS, gpu_pods="scheduler", clock=lambda: 0)
            for policy in ("gpupack", "FGD", "BestFit")]
    assert runs[0].alloc_at == runs[1].alloc_at == runs[2].alloc_at
    assert all(r.policy_builds == 1 and r.gpu_pods == "scheduler" for r in runs)
    guided = run_dra(cluster, TRACE, "gpupack", 5, WEIGHTS, clock=lambda: 0)
    assert guided.gpu_pods == "engine" and guided.pods == runs[0].pods
