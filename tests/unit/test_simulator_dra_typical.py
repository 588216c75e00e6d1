"""The DRA model's typical-pods rules: ``present`` (the live controller's) against ``workload`` (the FGD protocol's)."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sharing.simulator.dra as dra
from gpupack.cli import main
from sharing.packing.cluster import ClusterState
from sharing.packing.kube_scoring import MostAllocatedWeights
from sharing.packing.policy import Policy, schedule
from sharing.packing.registry import make_policy
from sharing.packing.specs import NodeSpec, PodPlacement, PodSpec
from sharing.packing.typical import TypicalCounts, TypicalPods, same_table
from sharing.simulator.arrivals import RunPlan
from sharing.simulator.dra import NO_GPU_POD, DraReplay, PresentTypical, as_claimed, run_dra
from sharing.simulator.replay import _continue_stream
from sharing.simulator.workload import Workload, build_workload

WEIGHTS = MostAllocatedWeights(cpu=50, memory=50, gpu=1, gpu_shared=1)


def gpu_pod(name: str, milli: int, count: int = 1, cpu: int = 1000) -> PodSpec:
    return PodSpec(name, cpu, 1024, count, milli)


def nodes(gpus: Sequence[int], cpu: int = 24_000) -> list[NodeSpec]:
    return [NodeSpec(f"n{i}", cpu, 256_000, g, "T4") for i, g in enumerate(gpus)]


TRACE = [gpu_pod(f"p{i:02d}", m, cpu=2000) for i, m in enumerate([1000, 500, 250, 810, 470, 1000, 320, 650, 130, 70] * 2)]
TRACE += [gpu_pod("multi", 1000, count=2, cpu=4000), PodSpec("cpu-a", 8000, 4096), PodSpec("cpu-b", 16000, 8192)]

Decision = tuple[str, int, tuple[int, ...]] | tuple[str, None]


@pytest.fixture
def decisions(monkeypatch: pytest.MonkeyPatch) -> list[Decision]:
    """Every decision of the engine (``schedule``) the DRA model asks for, in order."""
    seen: list[Decision] = []

    def recording(cluster: ClusterState, pod: PodSpec, policy: Policy) -> Any:
        outcome = schedule(cluster, pod, policy)
        seen.append((pod.name, outcome.node, outcome.gpus) if isinstance(outcome, PodPlacement) else (pod.name, None))
        return outcome

    monkeypatch.setattr(dra, "schedule", recording)
    return seen


# ------------------------------------------------------------------ the counts
def test_counted_pods_give_the_table_of_those_pods() -> None:
    counts = TypicalCounts()
    pods = [as_claimed(p, 50) for p in TRACE if p.gpu_count]
    for k, pod in enumerate(pods, 1):
        counts.add(pod)
        assert len(counts) == k
        assert counts.table() == TypicalPods.from_pods(pods[:k])


def test_an_empty_count_has_no_table() -> None:
    with pytest.raises(ValueError, match="at least one pod"):
        TypicalCounts().table()


def test_the_same_table_is_its_keys_and_probabilities() -> None:
    one = TypicalPods.from_pods([gpu_pod("a", 300), gpu_pod("b", 500)])
    twice = TypicalPods.from_pods([gpu_pod("a", 300), gpu_pod("b", 500)] * 2)
    assert one != twice and same_table(one, twice)  # more pods, same distribution
    assert not same_table(one, TypicalPods.from_pods([gpu_pod("a", 300), gpu_pod("b", 500), gpu_pod("c", 500)]))


def test_present_counts_gpu_pods_as_claimed_and_no_cpu_only_pod() -> None:
    pods = [PodSpec("cpu", 4000, 1024), gpu_pod("a", 120), gpu_pod("b", 1000)]
    present = PresentTypical(pods, 50, every=1)
    assert not present.advance(0) and present.table == TypicalPods.from_pods([NO_GPU_POD])
    assert present.advance(1) and present.table.gpu_milli == (150,)
    assert present.advance(2) and sorted(present.table.gpu_milli) == [150, 1000]


def test_present_in_batches_counts_the_whole_batch_at_its_first_pod() -> None:
    pods = [gpu_pod(f"p{i}", m) for i, m in enumerate([300, 500, 500, 700, 300])]
    present = PresentTypical(pods, 50, every=2)
    assert present.advance(0) and present.table == TypicalPods.from_pods(pods[:2])
    assert not present.advance(1)  # the batch's second pod: the table built for the batch holds
    assert present.advance(2) and present.table == TypicalPods.from_pods(pods[:4])
    assert present.advance(4) and present.table == TypicalPods.from_pods(pods)
    with pytest.raises(ValueError, match="at least 1"):
        PresentTypical(pods, 50, every=0)


# ------------------------------------------------------------------ the present rule is the live rule
def rebuilt_before_every_pod(cluster: list[NodeSpec], trace: Sequence[PodSpec], policy: str, seed: int,
                             cpu_pods: dra.CpuPods) -> int:
    """The live rule spelled out: a policy built from scratch, before every pod, from the pods the
    engine places (GPU pods; CPU-only ones too when it places those) arrived so far and the
    arriving one (the controller's fallback while there is none); the number of pods the engine
    is asked to place."""
    ordered = sorted(cluster, key=lambda n: n.name)
    workload = build_workload(trace, len(ordered), sum(n.gpu_count for n in ordered), seed)
    rng = _continue_stream(np.random.default_rng(seed), workload)
    replay = DraReplay(ClusterState(ordered, tie_rank=workload.tie_rank),
                       make_policy(policy, rng=rng, typical=TypicalPods.from_pods([NO_GPU_POD])), WEIGHTS, 50, cpu_pods)
    for i, pod in enumerate(workload.pods):
        arrived = [as_claimed(p, 50) for p in workload.pods[: i + 1] if p.gpu_count or cpu_pods == "engine"]
        replay.policy = make_policy(policy, rng=rng, typical=TypicalPods.from_pods(arrived or [NO_GPU_POD]))
        replay.place(pod)
    return sum(1 for p in workload.pods if p.gpu_count or cpu_pods == "engine")


@pytest.mark.parametrize("cpu_pods", ["scheduler", "engine"])
@pytest.mark.parametrize("policy", ["FGD", "gpupack"])
def test_present_places_every_pod_as_a_policy_rebuilt_before_each_pod_would(
        decisions: list[Decision], policy: str, cpu_pods: dra.CpuPods) -> None:
    cluster = nodes([2, 2, 4, 1])
    for seed in (3, 7):
        run = run_dra(cluster, TRACE, policy, seed, WEIGHTS, cpu_pods=cpu_pods, typical="present", typical_every=1)
        incremental = list(decisions)
        decisions.clear()
        asked = rebuilt_before_every_pod(cluster, TRACE, policy, seed, cpu_pods)
        assert incremental == decisions and len(incremental) == asked
        decisions.clear()
        # The table changed on most GPU pods, and the policy was rebuilt only then.
        assert 10 < run.policy_builds <= 1 + run.pods


def test_the_policy_is_rebuilt_only_when_the_table_changes() -> None:
    same = [gpu_pod(f"p{i}", 300) for i in range(8)]
    run = run_dra(nodes([2, 2]), same, "FGD", 42, WEIGHTS, typical="present", typical_every=1)
    assert run.policy_builds == 2  # the fallback, then the 300-milli pods' table, which never changes


def test_policies_without_typical_pods_and_the_workload_rule_build_once() -> None:
    for policy, rule in (("BestFit", "present"), ("Random", "present"), ("gpupack", "workload")):
        run = run_dra(nodes([2, 2, 4, 1]), TRACE, policy, 42, WEIGHTS, typical=rule)  # type: ignore[arg-type]
        assert run.policy_builds == 1 and run.typical == rule


def test_rebuilding_less_often_changes_only_the_fragmentation_aware_policies() -> None:
    cluster = nodes([2, 2, 4, 1])
    exact, batched = (run_dra(cluster, TRACE, "BestFit", 5, WEIGHTS, typical_every=k) for k in (1, 10))
    assert exact.alloc_at == batched.alloc_at and exact.failed_pods == batched.failed_pods
    gp = run_dra(cluster, TRACE, "gpupack", 5, WEIGHTS, typical_every=10)
    assert gp.policy_builds <= 1 + -(-gp.pods // 10) and gp.typical_every == 10


# ------------------------------------------------------------------ present differs from workload
def test_present_and_workload_place_differently_when_the_future_pods_differ(
        monkeypatch: pytest.MonkeyPatch, decisions: list[Decision]) -> None:
    """Two one-GPU nodes; a 600, then a 300, then nineteen more 300s.

    When the second pod arrives the pods present are a 600 and a 300: next to the 600 the 300 leaves
    100 milli, which is worth less than the 400 left that the 600-shaped typical pod cannot use, so
    FGD puts it there. The whole run is 300s (95 % of it, the table's cut): next to the 600 the 300
    would strand 100 milli no 300 can use, so FGD puts it on the empty GPU.
    """
    trace = (gpu_pod("big", 600, cpu=100), *(gpu_pod(f"s{i:02d}", 300, cpu=100) for i in range(20)))
    cluster = nodes([1, 1])
    monkeypatch.setattr(dra, "plan_run", lambda nodes, *args: RunPlan(
        tuple(nodes), Workload(0, trace, (0, 1), trace, 0, 0), None, len(nodes)))
    where: dict[str, dict[str, int | None]] = {}
    for rule in dra.TYPICAL_RULES:
        decisions.clear()
        run_dra(cluster, trace, "FGD", 42, WEIGHTS, typical=rule, typical_every=1)
        where[rule] = {name: node for name, node, *_ in decisions}
    assert where["present"]["s00"] == where["present"]["big"]
    assert where["workload"]["s00"] != where["workload"]["big"]


def test_an_unknown_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="choose one of present, workload"):
        run_dra(nodes([1]), TRACE, "FGD", 42, WEIGHTS, typical="future")  # type: ignore[arg-type]


# ------------------------------------------------------------------ the CLI
NODES_CSV = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(f"n{i},32000,65536,2,T4\n" for i in range(3))
PODS_CSV = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n" + "".join(
    f"p{i:02d},2000,4096,1,{m},\n" for i, m in enumerate([1000, 500, 250, 810, 470, 1000, 320, 650] * 2))


@pytest.fixture
def simulate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """``gpupack simulate --model product --backend dra`` on a tiny trace: exit code, stdout, stderr."""
    (tmp_path / "nodes.csv").write_text(NODES_CSV)
    (tmp_path / "openb_pod_list_tiny.csv").write_text(PODS_CSV)

    def call(*args: str) -> tuple[int, str, str]:
        code = main(["simulate", "--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "openb_pod_list_tiny.csv"),
                     "--policy", "gpupack", "--model", "product", *args])
        out = capsys.readouterr()
        return code, out.out, out.err

    return call


def test_the_cli_runs_the_present_rule_by_default_and_says_so_in_json(simulate: Callable[..., tuple[int, str, str]]) -> None:
    code, out, _ = simulate("--backend", "dra", "--json")
    assert code == 0 and json.loads(out)["typical"] == "present"
    assert json.loads(out)["typical_every"] == dra.DEFAULT_TYPICAL_EVERY
    code, out, _ = simulate("--backend", "dra", "--typical", "present", "--typical-every", "1", "--json")
    assert code == 0 and (json.loads(out)["typical"], json.loads(out)["typical_every"]) == ("present", 1)
    code, out, _ = simulate("--backend", "dra", "--typical", "workload", "--json")
    assert code == 0 and json.loads(out)["typical"] == "workload" and "typical_every" not in json.loads(out)
    code, out, _ = simulate("--backend", "dra", "--typical", "workload")
    assert code == 0 and "typical pods: the whole run's pods" in out
    code, out, _ = simulate("--backend", "dra")
    assert code == 0 and f"typical pods: the pods present, rebuilt at most every {dra.DEFAULT_TYPICAL_EVERY}" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--model", "fgd", "--typical", "present"), "--typical applies to --model product only"),
        (("--model", "fgd", "--typical-every", "5"), "--typical-every applies to --model product only"),
        (("--backend", "dra", "--typical", "workload", "--typical-every", "5"), "applies to --typical present only"),
        (("--backend", "dra", "--typical-every", "0"), "--typical-every must be at least 1, got 0"),
    ],
    ids=["rule-without-product", "every-without-product", "every-with-workload", "every-zero"],
)
def test_the_cli_refuses_typical_flags_that_do_not_apply(
        simulate: Callable[..., tuple[int, str, str]], args: tuple[str, ...], message: str) -> None:
    code, _, err = simulate(*args)
    assert code == 2 and message in err


def test_the_cli_refuses_an_unknown_rule(simulate: Callable[..., tuple[int, str, str]]) -> None:
    with pytest.raises(SystemExit) as exit_:
        simulate("--backend", "dra", "--typical", "future")
    assert exit_.value.code == 2


# ------------------------------------------------------------------ the benchmark driver
@pytest.fixture(scope="module")
def driver() -> Any:
    """``benchmarks/simulate_dra.py`` as a module (it finds its neighbours through its own folder)."""
    folder = Path(__file__).resolve().parents[2] / "benchmarks"
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location("simulate_dra", folder / "simulate_dra.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
    return module


def test_the_driver_runs_each_rule_only_where_it_matters_and_skips_kept_runs(driver: Any) -> None:
    jobs = driver.jobs_for(["default"], (42,), ["present", "workload"], "t", 50, 50)
    kinds = sorted((config, policy, rule) for _, config, policy, _, _, _, rule, _ in jobs)
    # The protocol once; per DRA config BestFit once and FGD, gpupack per rule; kube-scheduler
    # unguided (no policy, no typical pods) once.
    assert kinds.count(("protocol", "gpupack", "workload")) == 1 and len(kinds) == 1 + 2 * (1 + 2 * 2) + 1
    assert [k for k in kinds if k[0] == "dra-unguided"] == [("dra-unguided", driver.UNGUIDED, "present")]
    assert ("dra", "BestFit", "workload") not in kinds and ("dra", "gpupack", "present") in kinds
    kept = [{"workload": "default", "config": c, "policy": p, "seed": 42} | ({"typical": "workload"} if p != "BestFit" else {})
            for c, p in driver.CONFIGS]
    only_present = driver.jobs_for(["default"], (42,), ["present"], "t", 50, 50, {driver._key_of(r) for r in kept})
    assert sorted((c, p, r) for _, c, p, _, _, _, r, _ in only_present) == [
        ("dra", "FGD", "present"), ("dra", "gpupack", "present"),
        ("dra-cpu-engine", "FGD", "present"), ("dra-cpu-engine", "gpupack", "present")]


def test_the_driver_compares_both_rules_over_the_same_seeds(driver: Any) -> None:
    def run(config: str, policy: str, seed: int, alloc: float, typical: str | None = None) -> dict[str, Any]:
        return {"workload": "default", "config": config, "policy": policy, "seed": seed, "alloc_130": alloc,
                **({"typical": typical} if typical else {})}

    runs = [run("protocol", "gpupack", s, 96.0) for s in (42, 43)] + [run("dra", "BestFit", s, 90.0) for s in (42, 43)]
    runs += [run("dra", "FGD", s, 88.0) for s in (42, 43)] + [run("dra", "gpupack", s, 89.0) for s in (42, 43)]
    runs += [run("dra", "FGD", 42, 87.0, "present"), run("dra", "gpupack", 42, 88.0, "present")]
    one_seed = driver.targets({"seeds": [42], "runs": runs}, "dra", "present")["default"]
    assert (one_seed["FGD"], one_seed["gpupack"], one_seed["above_FGD"]) == (87.0, 88.0, 1.0)
    assert "unguided" not in one_seed  # no unguided run: the column is left out, not the workload
    guided = driver.targets({"seeds": [42], "runs": [*runs, run("dra-unguided", driver.UNGUIDED, 42, 88.5)]},
                            "dra", "present")["default"]
    assert (guided["unguided"], guided["above_unguided"], guided["beats_unguided"]) == (88.5, -0.5, False)
    assert driver.targets({"seeds": [42, 43], "runs": runs}, "dra", "present") == {}  # seed 43 has no present run
    assert driver.rules_of({"seeds": [42], "runs": runs}) == ("present", "workload")
