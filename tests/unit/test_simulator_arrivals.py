"""One run's arrival plan (``sharing.simulator.arrivals``): the node sample, arrivals scaled to it, and
``gpupack simulate --max-nodes`` replaying exactly that plan under every model."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import sharing.simulator.product as product
from gpupack.cli import main
from sharing.packing.specs import GPU_MILLI, NodeSpec, PodSpec
from sharing.simulator.arrivals import RunPlan, check_max_nodes, plan_run, sample_nodes
from sharing.simulator.traces import load_nodes, load_pods
from sharing.simulator.workload import build_workload

GPUS = [1, 2, 4, 8, 2, 1, 0, 4, 2, 8]
"""GPUs per node of the tiny cluster; the 0 is a CPU-only node."""
NODES = tuple(
    NodeSpec(name=f"n{i}", cpu_milli=32000, memory_mib=65536, gpu_count=g, gpu_model="T4" if g else "")
    for i, g in enumerate(GPUS)
)
MILLI = [1000, 500, 250, 810, 470, 1000, 320, 650, 0, 100]
PODS = tuple(
    PodSpec(name=f"p{i:02d}", cpu_milli=2000, memory_mib=4096, gpu_count=1 if m else 0, gpu_milli=m)
    for i, m in enumerate(MILLI * 3)
)


def demand(plan: RunPlan) -> int:
    return sum(p.gpu_total_milli for p in plan.workload.pods)


# ------------------------------------------------------------------ the sample


def test_a_sample_is_deterministic_per_seed_in_node_list_order_and_differs_across_seeds() -> None:
    a, again = plan_run(NODES, PODS, 42, max_nodes=4), plan_run(NODES, PODS, 42, max_nodes=4)
    assert a == again
    assert len(a.nodes) == 4 and len(set(a.nodes)) == 4 and set(a.nodes) <= set(NODES)
    assert [NODES.index(n) for n in a.nodes] == sorted(NODES.index(n) for n in a.nodes)
    samples = {sample_nodes(NODES, s, 4) for s in range(42, 52)}
    assert len(samples) > 1
    assert a.sampled and a.max_nodes == 4 and a.cluster_nodes == len(NODES) and a.seed == 42


@pytest.mark.parametrize("k", [None, len(NODES), len(NODES) + 1, 10_000], ids=["none", "exact", "one-more", "huge"])
def test_a_sample_as_large_as_the_cluster_is_todays_run_bit_for_bit(k: int | None) -> None:
    plan = plan_run(NODES, PODS, 43, 1.3, k)
    assert plan.nodes == NODES and not plan.sampled
    assert plan.workload == build_workload(PODS, len(NODES), sum(GPUS), 43, 1.3)
    assert plan.workload == plan_run(NODES, PODS, 43, 1.3).workload


def test_sampling_leaves_the_protocol_stream_alone() -> None:
    """The arrivals on a sample are the protocol's for a cluster of just those nodes: same shuffle,
    tuning and tie ranks as ``build_workload`` seeded with the seed alone."""
    for seed in (42, 45, 51):
        plan = plan_run(NODES, PODS, seed, 1.3, 5)
        assert plan.workload == build_workload(PODS, 5, plan.gpus, seed, 1.3)
        assert plan.workload == plan_run(plan.nodes, PODS, seed, 1.3).workload
        assert sorted(plan.workload.tie_rank) == list(range(5))


def test_cpu_only_nodes_are_drawn_like_any_other() -> None:
    cpu_only = NODES[GPUS.index(0)]
    picked = [cpu_only in sample_nodes(NODES, s, 5) for s in range(200)]
    assert 60 < sum(picked) < 140  # 5 of 10 rows: about half the samples hold it


@pytest.mark.parametrize("seed", [42, 43, 44, 45])
@pytest.mark.parametrize("inflate", [0.5, 1.3, 2.0])
def test_arrived_demand_is_tuned_to_inflate_times_the_samples_capacity(seed: int, inflate: float) -> None:
    plan = plan_run(NODES, PODS, seed, inflate, 3)
    target = inflate * plan.gpus * GPU_MILLI
    trace_demand = sum(p.gpu_total_milli for p in PODS)
    if trace_demand > target:  # tuned down: random removals until at most the target
        assert plan.workload.removed > 0 and demand(plan) <= target
        assert demand(plan) + max(MILLI) > target
    else:  # tuned up: clones until the next draw would pass the target (stop test on per-GPU milli)
        assert plan.workload.clones > 0 and target - max(MILLI) < demand(plan) <= target
    assert plan.gpus == sum(n.gpu_count for n in plan.nodes)
    whole = plan_run(NODES, PODS, seed, inflate)
    assert demand(whole) > demand(plan) or plan.gpus == whole.gpus


@pytest.mark.parametrize("k", [0, -1, -100], ids=["zero", "minus-one", "minus-hundred"])
def test_a_sample_of_fewer_than_one_node_is_refused(k: int) -> None:
    with pytest.raises(ValueError, match=f"max_nodes must be at least 1, got {k}"):
        plan_run(NODES, PODS, 42, max_nodes=k)


def test_other_bad_inputs_are_refused_with_reasons() -> None:
    with pytest.raises(ValueError, match="whole number of nodes, got True"):
        check_max_nodes(True)
    with pytest.raises(ValueError, match="whole number of nodes, got 2.5"):
        check_max_nodes(2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="node list is empty"):
        plan_run((), PODS, 42)
    cpu = NodeSpec(name="c", cpu_milli=1000, memory_mib=1000, gpu_count=0, gpu_model="")
    pair = (cpu, NODES[3])
    seed = next(s for s in range(100) if sample_nodes(pair, s, 1) == (cpu,))
    with pytest.raises(ValueError, match=f"the seed-{seed} sample of 1 node\\(s\\) has no GPUs"):
        plan_run(pair, PODS, seed, 1.3, 1)
    with pytest.raises(ValueError, match="node list has no GPUs"):
        plan_run((cpu,), PODS, 42)


# ------------------------------------------------------------------ the CLI

NODES_CSV = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
    f"{n.name},{n.cpu_milli},{n.memory_mib},{n.gpu_count},{n.gpu_model}\n" for n in NODES
)
PODS_CSV = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n" + "".join(
    f"{p.name},{p.cpu_milli},{p.memory_mib},{p.gpu_count},{p.gpu_milli},\n" for p in PODS
)
MODELS = {
    "fgd": (),
    "product": ("--model", "product"),
    "dra": ("--model", "product", "--backend", "dra"),
}
"""Every simulate path that replays the node list."""


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "openb_pod_list_tiny.csv"
    nodes.write_text(NODES_CSV)
    pods.write_text(PODS_CSV)
    return nodes, pods


@pytest.fixture
def simulate(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """``gpupack simulate`` on the tiny trace (nodes CSV overridable): exit code, stdout, stderr."""

    def call(*args: str, nodes: Path = files[0]) -> tuple[int, str, str]:
        code = main(["simulate", "--nodes", str(nodes), "--pods", str(files[1]), "--policy", "gpupack", *args])
        out = capsys.readouterr()
        return code, out.out, out.err

    return call


def _figures(report: dict[str, Any]) -> dict[str, Any]:
    """A JSON report less what may differ between equal runs (time) or names the sample itself."""
    skip = {"decision_us_median", "max_nodes", "cluster_nodes", "nodes_used", "gpus_used"}
    return {k: v for k, v in report.items() if k not in skip}


@pytest.mark.parametrize("model", list(MODELS))
def test_json_reports_the_sample_and_the_run_is_the_one_on_those_nodes(
    model: str, simulate: Callable[..., tuple[int, str, str]], tmp_path: Path
) -> None:
    code, out, err = simulate(*MODELS[model], "--seed", "44", "--max-nodes", "4", "--json")
    assert code == 0, err
    report = json.loads(out)
    plan = plan_run(NODES, PODS, 44, 1.3, 4)
    assert (report["max_nodes"], report["cluster_nodes"], report["nodes_used"]) == (4, len(NODES), 4)
    assert report["gpus_used"] == [plan.gpus]
    # The same run as on a node list of just the sample's rows, in every model.
    only = tmp_path / "sample.csv"
    only.write_text("".join(
        line for i, line in enumerate(NODES_CSV.splitlines(keepends=True)) if i == 0 or NODES[i - 1] in plan.nodes
    ))
    code, out, err = simulate(*MODELS[model], "--seed", "44", "--json", nodes=only)
    assert code == 0, err
    alone = json.loads(out)
    assert alone["max_nodes"] is None and alone["nodes_used"] == 4 and alone["gpus_used"] == [plan.gpus]
    assert _figures(alone) == _figures(report)
    code, out, _ = simulate(*MODELS[model], "--seed", "44", "--json")
    assert _figures(json.loads(out))["alloc_at"] != report["alloc_at"]  # the whole cluster is another run


def test_simulate_product_replays_plan_runs_plan(
    simulate: Callable[..., tuple[int, str, str]], files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hook a live replay's test uses too: the plan ``gpupack simulate --model product`` replays for a
    seed is ``plan_run``'s for that seed."""
    used: list[RunPlan] = []

    def spy(*args: Any, **kwargs: Any) -> RunPlan:
        used.append(plan_run(*args, **kwargs))
        return used[-1]

    monkeypatch.setattr(product, "plan_run", spy)
    code, out, err = simulate("--model", "product", "--seeds", "2", "--max-nodes", "5", "--json")
    assert code == 0, err
    nodes, pods = load_nodes(files[0]), load_pods(files[1]).pods
    assert used == [plan_run(nodes, pods, seed, 1.3, 5) for seed in (42, 43)]
    assert json.loads(out)["gpus_used"] == [p.gpus for p in used]
    assert used[0].nodes != used[1].nodes  # each seed its own sample


def test_text_says_whether_a_sample_ran(simulate: Callable[..., tuple[int, str, str]]) -> None:
    code, out, _ = simulate("--model", "product", "--max-nodes", "3")
    assert code == 0 and f"nodes: a seeded sample of 3 of {len(NODES)} per seed" in out
    code, out, _ = simulate("--model", "product", "--max-nodes", "50", "--json")
    assert code == 0 and json.loads(out)["nodes_used"] == len(NODES)
    code, out, _ = simulate("--max-nodes", "50")
    assert code == 0 and f"nodes: all {len(NODES)} (--max-nodes 50 is at least the node count)" in out
    code, out, _ = simulate()
    assert code == 0 and "nodes:" not in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--max-nodes", "0"), "--max-nodes: max_nodes must be at least 1, got 0"),
        (("--model", "product", "--max-nodes", "-3"), "--max-nodes: max_nodes must be at least 1, got -3"),
        (("--mig", "A100-80GB", "--max-nodes", "4"), "--max-nodes does not apply to --mig"),
    ],
    ids=["zero", "negative", "mig"],
)
def test_bad_max_nodes_exit_2_with_a_reason(
    simulate: Callable[..., tuple[int, str, str]], args: tuple[str, ...], message: str
) -> None:
    code, out, err = simulate(*args)
    assert code == 2 and out == "" and message in err


def test_a_sample_without_gpus_is_a_usage_error(simulate: Callable[..., tuple[int, str, str]], tmp_path: Path) -> None:
    nodes = tmp_path / "mostly-cpu.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "".join(f"c{i},32000,65536,0,\n" for i in range(30))
                     + "g,32000,65536,2,T4\n")
    seed = next(s for s in range(100) if all(n.gpu_count == 0 for n in sample_nodes(load_nodes(nodes), s, 1)))
    code, _, err = simulate("--seed", str(seed), "--max-nodes", "1", nodes=nodes)
    assert code == 2 and f"the seed-{seed} sample of 1 node(s) has no GPUs" in err
