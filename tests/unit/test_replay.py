"""``gpupack replay`` without a cluster: the trace's rows as Nodes and pods, reading a pod's outcome, the
figures and costs, the JSON shape, bad input, the stack's pieces (the fleet's argv, the webhook probe),
and the arrival sequence it shares with ``gpupack simulate``."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import sharing.simulator.product as product
from gpupack.cli import build_parser, main
from gpupack.demo.stack import probe_pod, webhook_mutated
from gpupack.replay import runner
from gpupack.replay.costs import ComponentCost, ProcessSample, component_cost, delta, requests_by_verb, sample
from gpupack.replay.figures import follow_live, level_at, live_alloc_at, model_figures, percentile
from gpupack.replay.mapping import NODE_POD_CAPACITY, REPLAY_LABEL, replay_node, replay_pod
from gpupack.replay.outcome import classify, released_unschedulable
from gpupack.replay.progress import ProgressBar, bar_line
from gpupack.replay.report import as_json, as_text
from gpupack.replay.runner import LiveRun, PodResult, submission_order
from gpupack.replay.stack import fleet_argv, node_advertised, policy_object
from sharing.admission.inventory import build_inventory
from sharing.api.keys import (
    MILLI_RESOURCE, PLACEMENT_CONDITION, PRODUCT_LABEL, SHARING_ANNOTATION, SIMULATED_GPUS_ANNOTATION, WHOLE_RESOURCE,
)
from sharing.packing.specs import NodeSpec, PodSpec
from sharing.admission.patch import apply_patch
from sharing.simulator.arrivals import RunPlan, plan_run
from sharing.simulator.metrics import alloc_by_level
from sharing.simulator.traces import load_nodes, load_pods
from webhook.admission import mutate
from webhook.settings import WebhookSettings
from gpupack.testing.admission_reviews import make_review

NODES_CSV = """sn,cpu_milli,memory_mib,gpu,model
openb-node-0000,64000,262144,2,T4
openb-node-0001,96000,786432,8,G2
openb-node-0002,64000,262144,4,V100M16
openb-node-0003,32000,131072,2,P100
openb-node-0004,96000,786432,8,V100M32
openb-node-0005,64000,262144,1,A10
"""
PODS_CSV = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n" + "".join(
    f"openb-pod-{i:04d},{(i % 4 + 1) * 2000},{(i % 3 + 1) * 4096},{g},{m},{spec}\n"
    for i, (g, m, spec) in enumerate([(1, 250, ""), (1, 1000, ""), (2, 1000, ""), (0, 0, ""), (1, 500, "V100M16|G2"),
                                      (1, 700, ""), (1, 100, ""), (4, 1000, "V100M32"), (1, 300, "")] * 4)
)


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "openb_pod_list_tiny.csv"
    nodes.write_text(NODES_CSV)
    pods.write_text(PODS_CSV)
    return nodes, pods


def spec(**kw: Any) -> PodSpec:
    return PodSpec(**{"name": "openb-pod-0001", "cpu_milli": 4000, "memory_mib": 8192, **kw})


# ------------------------------------------------------------------ mapping


def test_a_node_row_becomes_a_kwok_node_the_fleet_serves() -> None:
    node = replay_node(NodeSpec("openb-node-0007", 96000, 786432, 8, "V100M32"), 7)
    meta, status = node["metadata"], node["status"]
    assert meta["name"] == "openb-node-0007"
    assert meta["annotations"][SIMULATED_GPUS_ANNOTATION] == "V100M32:8"
    assert meta["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert meta["labels"][REPLAY_LABEL] == "on" and meta["labels"]["gpupack.io/backend"] == "device-plugin"
    assert PRODUCT_LABEL not in meta["labels"]  # the fleet's device-plugin emulator labels it, as GFD would
    assert status["capacity"] == {"cpu": "96000m", "memory": "786432Mi", "pods": str(NODE_POD_CAPACITY)}
    assert WHOLE_RESOURCE not in status["allocatable"]  # advertised by the emulated device plugin
    assert status["addresses"][0]["address"] == "10.64.0.8"


def test_a_cpu_only_node_gets_no_gpus_and_an_unknown_type_is_refused() -> None:
    cpu_only = replay_node(NodeSpec("cpu-node", 32000, 65536, 0, ""), 0)
    assert SIMULATED_GPUS_ANNOTATION not in cpu_only["metadata"]["annotations"]
    with pytest.raises(ValueError, match="unknown openb GPU type 'H800'"):
        replay_node(NodeSpec("n", 32000, 65536, 8, "H800"), 0)


@pytest.mark.parametrize("pod, limits, annotations", [
    (spec(), None, None),
    (spec(gpu_count=1, gpu_milli=250), {MILLI_RESOURCE: "250"}, {SHARING_ANNOTATION: "mps"}),
    (spec(gpu_count=1, gpu_milli=700), {MILLI_RESOURCE: "700"}, {SHARING_ANNOTATION: "mps"}),
    (spec(gpu_count=1, gpu_milli=1000), {WHOLE_RESOURCE: "1"}, None),
    (spec(gpu_count=4, gpu_milli=1000), {WHOLE_RESOURCE: "4"}, None),
], ids=["cpu-only", "share", "above-half-a-gpu", "whole", "four-whole"])
def test_an_openb_request_becomes_the_pod_a_user_writes(pod: PodSpec, limits: dict[str, str] | None,
                                                        annotations: dict[str, str] | None) -> None:
    manifest = replay_pod(pod, "ns", "seed-42")
    container = manifest["spec"]["containers"][0]
    assert container["resources"]["requests"] == {"cpu": "4000m", "memory": "8192Mi"}
    assert container["resources"].get("limits") == limits
    assert manifest["metadata"].get("annotations") == annotations
    assert manifest["metadata"]["labels"] == {REPLAY_LABEL: "seed-42"}
    assert "affinity" not in manifest["spec"]
    assert not any("duration" in k for k in (manifest["metadata"].get("annotations") or {}))  # pods never leave


def test_a_gpu_spec_becomes_required_affinity_on_the_product() -> None:
    manifest = replay_pod(spec(gpu_count=1, gpu_milli=500, gpu_models=("V100M16", "G2"), gpu_spec="V100M16|G2"), "ns", "r")
    terms = manifest["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [{"matchExpressions": [
        {"key": PRODUCT_LABEL, "operator": "In", "values": ["Tesla-V100-SXM2-16GB", "openb-G2"]}]}]


def test_a_request_without_cpu_or_memory_asks_none() -> None:
    manifest = replay_pod(PodSpec("p", 0, 0, 1, 100), "ns", "r")
    assert manifest["spec"]["containers"][0]["resources"] == {"limits": {MILLI_RESOURCE: "100"}}


# ------------------------------------------------------------------ outcome of a pod


GATE = {"schedulingGates": [{"name": "gpupack.io/capacity"}]}


def placement(reason: str) -> dict[str, Any]:
    return {"type": PLACEMENT_CONDITION, "status": "True" if reason == "Placed" else "False", "reason": reason,
            "message": "why", "lastProbeTime": "2026-12-01T22:00:00Z", "lastTransitionTime": "2026-12-01T22:00:00Z"}


UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/4 nodes"}


@pytest.mark.parametrize("obj, expected", [
    ({"spec": {"nodeName": "n1"}}, ("bound", None)),
    ({"spec": GATE}, ("waiting", None)),
    ({"spec": GATE, "status": {"conditions": [placement("WaitingForCapacity")]}}, ("waiting", None)),
    ({"spec": GATE, "status": {"conditions": [placement("NoCapacity")]}}, ("unplaceable", "controller")),
    ({"spec": {}, "status": {"conditions": [UNSCHEDULABLE]}}, ("unplaceable", "scheduler")),
    ({"metadata": {"annotations": {"gpupack.io/allocation": "{}"}}, "spec": {}, "status": {"conditions": [UNSCHEDULABLE]}},
     ("waiting", None)),
    ({"spec": {}}, ("waiting", None)),
], ids=["bound", "gated", "gated-capacity-coming", "gated-no-capacity", "scheduler-unschedulable",
        "released-then-unschedulable", "pending"])
def test_classify(obj: dict[str, Any], expected: tuple[str, str | None]) -> None:
    assert classify(obj) == expected


def test_a_released_pod_kube_scheduler_finds_no_room_for_is_told_apart() -> None:
    released = {"metadata": {"annotations": {"gpupack.io/allocation": "{}"}}, "spec": {},
                "status": {"conditions": [UNSCHEDULABLE]}}
    assert released_unschedulable(released)
    assert not released_unschedulable({**released, "spec": GATE})  # still gated: the controller's to judge
    assert not released_unschedulable({**released, "spec": {"nodeName": "n1"}})
    assert not released_unschedulable({"spec": {}, "status": {"conditions": [UNSCHEDULABLE]}})  # not gpupack's


# ------------------------------------------------------------------ figures and costs


def test_live_allocation_is_the_simulators_accounting_of_the_bound_pods() -> None:
    pods = [PodSpec(f"p{i}", 0, 0, c, m) for i, (c, m) in enumerate([(1, 500), (2, 1000), (1, 250), (0, 0), (1, 1000)])]
    bound = [True, False, True, True, True]
    levels = live_alloc_at(pods, bound, total_gpus=4)
    expected = alloc_by_level(np.array([500, 2500, 2750, 2750, 3750]), np.array([500, 500, 750, 750, 1750]), 4)
    assert levels == expected
    assert level_at(levels, 130) == expected[94]
    with pytest.raises(ValueError):
        live_alloc_at(pods, bound[:2], 4)


def test_percentile_and_empty() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([], 95) is None


def test_proc_sample_reads_cpu_ticks_and_peak_rss(tmp_path: Path) -> None:
    (tmp_path / "41").mkdir()
    # comm with a space and a ')' inside; utime stime cutime cstime = 300 100 50 50 ticks
    fields = ["S", "1", "1", "1", "0", "-1", "0"] + ["0"] * 4 + ["300", "100", "50", "50"] + ["0"] * 30
    (tmp_path / "41" / "stat").write_text("41 (python -m (x)) " + " ".join(fields) + "\n")
    (tmp_path / "41" / "status").write_text("Name:\tpython\nVmHWM:\t  204800 kB\nVmRSS:\t1 kB\n")
    got = sample(41, tmp_path)
    assert got is not None and got.peak_rss_mib == 200.0
    assert got.cpu_seconds == pytest.approx(500 / __import__("os").sysconf("SC_CLK_TCK"))
    assert sample(42, tmp_path) is None


def test_component_cost_sums_processes_and_counts_only_the_window() -> None:
    before = {1: ProcessSample(10.0, 50.0), 2: ProcessSample(1.0, 40.0)}
    after = {1: ProcessSample(12.5, 80.0), 2: ProcessSample(2.0, 45.0), 3: ProcessSample(0.5, 30.0), 4: None}
    assert component_cost(before, after) == ComponentCost(4.0, 155.0, 3)


def test_api_requests_by_verb_from_the_apiservers_metrics() -> None:
    text = """# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="LIST",version="v1"} 7
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="POST",version="v1"} 12
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="cluster",subresource="status",verb="PATCH",version="v1"} 3e+03
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="bindings",scope="namespace",subresource="",verb="POST",version="v1"} 5
apiserver_request_duration_seconds_count{verb="GET"} 99
"""
    after = requests_by_verb(text)
    assert after == {"LIST": 7.0, "POST": 17.0, "PATCH": 3000.0}
    assert delta({"LIST": 7.0, "POST": 2.0}, after) == {"PATCH": 3000, "POST": 15}


def test_progress_bar_on_a_terminal_and_in_a_log() -> None:
    assert bar_line(5, 10, 4, 1, 60.0, 12.34).startswith("[" + "#" * 15 + "." * 15 + "]  5/10 pods  bound 4  never placed 1")
    assert "ETA 1m00s" in bar_line(5, 10, 4, 1, 60.0, 12.34)
    log = io.StringIO()
    bar = ProgressBar(100, stream=log, log_every=10, clock=lambda: 0.0)
    for done in range(1, 101):
        bar.update(done, done, 0, 1.0)
    assert len(log.getvalue().splitlines()) == 11  # 1 %, then every 10 % and the last


# ------------------------------------------------------------------ the stack's pieces


def test_fleet_argv_serves_the_replays_nodes_from_the_work_dir_without_stagger() -> None:
    assert fleet_argv("k.conf", Path("/s")) == [
        "agent", "fleet", "--kubeconfig", "k.conf", "--selector", f"{REPLAY_LABEL}=on", "--state-dir", "/s",
        "--stagger-seconds", "0"]


def test_fleet_argv_parses_as_the_fleet_command() -> None:
    args = build_parser().parse_args(fleet_argv("k.conf", Path("/s")))
    assert (args.command, args.agent_command) == ("agent", "fleet")
    assert (args.kubeconfig, args.selector, args.state_dir, args.stagger_seconds) == (
        "k.conf", f"{REPLAY_LABEL}=on", "/s", 0.0)


@pytest.mark.parametrize("sharing, inventory_file, mutated", [
    ("mps", None, True),  # the replay's probe: an openb cluster at the start, no MIG GPU nor shared node
    (None, None, False),  # the demo's auto probe there: refused, why the replay asks for mps
    (None, "examples/inventory.yaml", True),  # the demo's, on a cluster with MIG GPUs
], ids=["mps-on-empty", "auto-on-empty", "auto-on-mig"])
def test_the_webhook_probe_sees_a_mutation_in_any_mode(sharing: str | None, inventory_file: str | None,
                                                       mutated: bool) -> None:
    root = Path(__file__).resolve().parents[2]
    inventory = build_inventory(yaml.safe_load((root / inventory_file).read_text()) if inventory_file else [])
    probe = probe_pod(sharing)
    assert (probe["metadata"].get("annotations") or {}).get(SHARING_ANNOTATION) == sharing
    assert not webhook_mutated(probe["spec"]["containers"][0]["resources"]["limits"])
    answer = mutate(make_review(probe), inventory, WebhookSettings())["response"]
    assert answer["allowed"] == mutated
    if mutated:
        pod = apply_patch(probe, json.loads(base64.b64decode(answer["patch"])))
        assert webhook_mutated(pod["spec"]["containers"][0]["resources"]["limits"])


def test_policy_and_advertised() -> None:
    policy = policy_object(50)["spec"]
    assert policy["reshaping"] == {"maxConcurrent": 50, "idleSeconds": 0}
    assert policy["replicas"] == {"min": 1, "max": 8}
    node = {"metadata": {"labels": {PRODUCT_LABEL: "Tesla-T4"}}, "status": {"allocatable": {WHOLE_RESOURCE: "2"}}}
    assert node_advertised(node, 2) and not node_advertised(node, 4)
    assert not node_advertised({"status": {"allocatable": {WHOLE_RESOURCE: "2"}}}, 2)


# ------------------------------------------------------------------ the sequence shared with simulate


def test_replay_submits_the_arrival_sequence_simulate_replays_for_the_seed(
    files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``gpupack simulate --model product`` and ``gpupack replay`` with the same seed and ``--max-nodes``
    see the same nodes and the same pods in the same order: the plan simulate's product model replays is
    the one the replay hands its runner, whose submission order is that plan's."""
    replayed: list[RunPlan] = []
    simulated: list[RunPlan] = []

    def spy(*args: Any, **kwargs: Any) -> RunPlan:
        simulated.append(plan_run(*args, **kwargs))
        return simulated[-1]

    def fake_live(workdir: Path, plan: RunPlan, **_: Any) -> LiveRun:
        replayed.append(plan)
        return fake_run(plan)

    monkeypatch.setattr(product, "plan_run", spy)
    monkeypatch.setattr(runner, "run_live", fake_live)
    nodes, pods = files
    common = ["--nodes", str(nodes), "--pods", str(pods), "--seed", "43", "--max-nodes", "4"]
    assert main(["simulate", *common, "--model", "product", "--policy", "gpupack", "--json"]) == 0
    simulated_plan = simulated[-1]
    simulated.clear()
    capsys.readouterr()
    assert main(["replay", *common, "--json", "--no-progress"]) == 0
    assert replayed == [simulated_plan]
    order = submission_order(replayed[0])
    assert order == [p.name for p in simulated_plan.workload.pods]
    assert len(set(order)) == len(order) and len(replayed[0].nodes) == 4
    report = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in report["pods"]] == order
    # Another seed is another sequence.
    assert submission_order(plan_run(load_nodes(nodes), load_pods(pods).pods, 44, 1.3, 4)) != order


def fake_run(plan: RunPlan, bound_every: int = 3) -> LiveRun:
    """A LiveRun in which every ``bound_every``-th pod was never placed."""
    results = []
    for i, pod in enumerate(plan.workload.pods):
        if i % bound_every == bound_every - 1:
            results.append(PodResult(pod.name, pod, "unplaceable", "controller", message="no capacity", decided_seconds=2.0))
        else:
            results.append(PodResult(pod.name, pod, "bound", node=plan.nodes[0].name, bound_seconds=0.1 * (i % 7),
                                     decided_seconds=0.1 * (i % 7)))
    return LiveRun(plan=plan, results=results, agents="fleet", setup_seconds=30.0, submit_seconds=60.0,
                   components={name: ComponentCost(1.5, 100.0, 1) for name in ("controller", "webhook", "agents")},
                   api_requests={"POST": 12, "PATCH": 30}, replay_requests={"POST": 10})


REQUIRED_KEYS = {"alloc_at", "simulated_alloc_at", "pods_submitted", "pods_bound", "pods_unplaceable",
                 "bound_seconds_p50", "bound_seconds_p95", "api_requests", "components"}


def test_json_shape_and_summary(files: tuple[Path, Path]) -> None:
    nodes, trace = load_nodes(files[0]), load_pods(files[1])
    plan = plan_run(nodes, trace.pods, 42, 1.3, None)
    models = model_figures(nodes, trace.pods, "gpupack", 42, 1.3, None)
    report = as_json(fake_run(plan), models, workload="openb_pod_list_tiny", policy="gpupack", inflate=1.3, seconds=95.0)
    assert REQUIRED_KEYS <= set(report)
    assert set(report["components"]) == {"controller", "webhook", "agents"}
    assert all(set(c) >= {"cpu_seconds", "peak_rss_mib"} for c in report["components"].values())
    assert set(report["alloc_at"]) == {str(level) for level in range(131)}
    assert report["simulated_alloc_at"] == {str(k): v for k, v in models.product_alloc_at.items()}
    assert report["pods_submitted"] == len(plan.workload.pods) == report["pods_bound"] + report["pods_unplaceable"]
    assert report["unplaceable_by"] == {"controller": report["pods_unplaceable"]}
    assert report["bound_seconds_p95"] >= report["bound_seconds_p50"] >= 0
    json.dumps(report)  # serialisable
    text = as_text(report)
    assert "live" in text and "product" in text and "controller" in text and "never placed" in text


def test_model_figures_are_the_simulators_on_the_same_plan(files: tuple[Path, Path]) -> None:
    """The product model's figure is the mean of its draws of kube-scheduler's ties, each a run of the
    simulator on the replay's plan with typical pods rebuilt per pod (one pod at a time, as submitted)."""
    nodes, trace = load_nodes(files[0]), load_pods(files[1])
    models = model_figures(nodes, trace.pods, "gpupack", 43, 1.3, 4, draws=3)
    from sharing.simulator.replay import run_once
    from sharing.simulator.scheduler_config import load_weights

    runs = [product.run_product(nodes, trace.pods, "gpupack", 43, load_weights(), "engine", 1.3, max_nodes=4,
                                typical_every=1, scheduler_draw=d) for d in range(3)]
    assert models.product_draws_at_130 == tuple(level_at(r.alloc_at, 130) for r in runs)
    for level, value in models.product_alloc_at.items():
        values = [r.alloc_at[level] for r in runs]
        assert value == (None if None in values else round(sum(v for v in values if v is not None) / 3, 2))
    assert models.product_failed_pods == round(sum(r.failed_pods for r in runs) / 3, 1)
    fgd = run_once(nodes, trace.pods, "gpupack", 43, 1.3, max_nodes=4)
    assert (models.fgd_alloc_at, models.fgd_failed_pods) == (fgd.alloc_at, fgd.failed_pods)
    with pytest.raises(ValueError, match="draws must be at least 1"):
        model_figures(nodes, trace.pods, "gpupack", 43, 1.3, 4, draws=0)


def test_kube_schedulers_ties_are_drawn_at_random_and_each_draw_is_repeatable(tmp_path: Path) -> None:
    (tmp_path / "nodes.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
        f"openb-node-{i:04d},64000,262144,4,T4\n" for i in range(6)))  # alike: kube-scheduler's pods tie
    (tmp_path / "pods.csv").write_text(PODS_CSV)
    nodes, trace = load_nodes(tmp_path / "nodes.csv"), load_pods(tmp_path / "pods.csv")
    from sharing.simulator.scheduler_config import load_weights

    pods = len(plan_run(nodes, trace.pods, 42, 1.3, None).workload.pods)

    def draw(d: int) -> tuple[tuple[int, str | None], ...]:
        """Where the model put each pod (its divergences from a run that chose nothing)."""
        run = product.run_product(nodes, trace.pods, "gpupack", 42, load_weights(), "engine", 1.3, typical_every=1,
                                  scheduler_draw=d, follow=[None] * pods)
        return tuple((d_.index, d_.model) for d_ in run.divergences)

    assert draw(1) == draw(1)
    assert len({draw(d) for d in range(8)}) > 1  # two nodes of a kind tie: the draws part there


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("args, message", [
    (["--max-nodes", "0"], "--max-nodes must be at least 1"),
    (["--inflate", "0"], "--inflate must be greater than 0"),
    (["--policy", "nope"], "nope"),
], ids=["max-nodes", "inflate", "policy"])
def test_bad_flags_exit_2_with_a_reason(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str],
                                        args: list[str], message: str) -> None:
    code = main(["replay", "--nodes", str(files[0]), "--pods", str(files[1]), *args])
    assert code == 2 and message in capsys.readouterr().err


def test_bad_files_exit_2_naming_the_file(files: tuple[Path, Path], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--nodes", str(tmp_path / "missing.csv"), "--pods", str(files[1])]) == 2
    assert "missing.csv: no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,32000,65536,4,H800\n")
    assert main(["replay", "--nodes", str(bad), "--pods", str(files[1])]) == 2
    assert "unknown openb GPU type 'H800'" in capsys.readouterr().err


# ------------------------------------------------------------------ following a live run


def _model_choices(nodes: list[NodeSpec], pods: list[PodSpec], seed: int, max_nodes: int | None) -> list[str | None]:
    """The product model's own node per pod, read by following a run that made no choice."""
    plan = plan_run(nodes, pods, seed, 1.3, max_nodes)
    silent = product.run_product(nodes, pods, "gpupack", seed, load_weights_(), "engine", 1.3, max_nodes=max_nodes,
                                 follow=[None] * len(plan.workload.pods))
    chosen: dict[int, str | None] = {d.index: d.model for d in silent.divergences}
    return [chosen.get(i) for i in range(len(plan.workload.pods))]


def load_weights_() -> Any:
    from sharing.simulator.scheduler_config import load_weights

    return load_weights()


def test_the_model_follows_a_run_that_made_its_own_choices(files: tuple[Path, Path]) -> None:
    nodes, trace = load_nodes(files[0]), load_pods(files[1])
    choices = _model_choices(nodes, trace.pods, 42, None)
    assert any(choices) and None in choices  # some placed, some never placed
    following = follow_live(nodes, trace.pods, "gpupack", 42, 1.3, None, choices)
    assert following.divergences == ()
    alone = product.run_product(nodes, trace.pods, "gpupack", 42, load_weights_(), "engine", 1.3)
    assert following.alloc_at == alone.alloc_at


def test_a_live_choice_the_models_rules_never_make_is_a_divergence(files: tuple[Path, Path]) -> None:
    nodes, trace = load_nodes(files[0]), load_pods(files[1])
    choices = _model_choices(nodes, trace.pods, 42, None)
    plan = plan_run(nodes, trace.pods, 42, 1.3, None)
    # A whole-GPU pod bound to the 1-GPU A10 node although the model gives it another: not a tie,
    # so the model places it its own way and says so.
    index, pod = next((i, p) for i, p in enumerate(plan.workload.pods)
                      if p.gpu_count == 4 and choices[i] is not None)
    moved = list(choices)
    moved[index] = "openb-node-0005"
    following = follow_live(nodes, trace.pods, "gpupack", 42, 1.3, None, moved)
    assert following.divergences[0].index == index and following.divergences[0].pod == pod.name
    assert following.divergences[0].live == "openb-node-0005" and following.divergences[0].model == choices[index]
    with pytest.raises(ValueError, match="not a node of the run"):
        follow_live(nodes, trace.pods, "gpupack", 42, 1.3, None, ["nowhere"] * len(plan.workload.pods))


def test_the_report_says_whether_the_model_follows_the_live_run(files: tuple[Path, Path]) -> None:
    nodes, trace = load_nodes(files[0]), load_pods(files[1])
    plan = plan_run(nodes, trace.pods, 42, 1.3, None)
    models = model_figures(nodes, trace.pods, "gpupack", 42, 1.3, None)
    choices = _model_choices(nodes, trace.pods, 42, None)
    following = follow_live(nodes, trace.pods, "gpupack", 42, 1.3, None, choices)
    report = as_json(fake_run(plan), models, workload="tiny", policy="gpupack", inflate=1.3, seconds=1.0,
                     following=following)
    assert report["model_following_live"]["divergences"] == 0
    assert report["model_following_live"]["pods"] == len(plan.workload.pods)
    assert "every live decision is one the model's rules make" in as_text(report)
    assert "model_following_live" not in as_json(fake_run(plan), models, workload="tiny", policy="gpupack",
                                                  inflate=1.3, seconds=1.0)


# ------------------------------------------------------------------ a run stopped early


def test_the_model_stopped_after_n_arrivals_is_the_full_run_cut_there(files: tuple[Path, Path]) -> None:
    """A live run stopped early is compared with the model on the same prefix: the same decisions,
    the same levels up to where it stopped, nothing past it."""
    nodes, trace = load_nodes(files[0]), load_pods(files[1])
    count = len(plan_run(nodes, trace.pods, 42, 1.3, None).workload.pods)
    whole = product.run_product(nodes, trace.pods, "gpupack", 42, load_weights_(), "engine", 1.3, typical_every=1,
                                follow=[None] * count)
    half = count // 2
    cut = product.run_product(nodes, trace.pods, "gpupack", 42, load_weights_(), "engine", 1.3, typical_every=1,
                              follow=[None] * half, stop_after=half)
    assert cut.pods == half
    assert cut.divergences == tuple(d for d in whole.divergences if d.index < half)  # where each pod went
    reached = max(k for k, v in cut.alloc_at.items() if v is not None)
    assert reached < 130 and all(cut.alloc_at[k] is None for k in range(reached + 1, 131))
    assert {k: cut.alloc_at[k] for k in range(reached)} == {k: whole.alloc_at[k] for k in range(reached)}
    for bad in (0, count + 1):
        with pytest.raises(ValueError, match="stop_after must be between 1 and"):
            product.run_product(nodes, trace.pods, "gpupack", 42, load_weights_(), "engine", 1.3, stop_after=bad)
    with pytest.raises(ValueError, match=f"follow: {count} outcomes for {half} pods"):
        product.run_product(nodes, trace.pods, "gpupack", 42, load_weights_(), "engine", 1.3,
                            follow=[None] * count, stop_after=half)


def test_a_run_stopped_early_is_reported_as_such_and_compared_where_it_got_to(files: tuple[Path, Path]) -> None:
    from gpupack.replay.report import compared_level

    nodes, trace = load_nodes(files[0]), load_pods(files[1])
    plan = plan_run(nodes, trace.pods, 42, 1.3, None)
    models = model_figures(nodes, trace.pods, "gpupack", 42, 1.3, None, draws=1)
    full = fake_run(plan)
    stopped = LiveRun(plan=plan, results=full.results[: len(full.results) // 2], agents="fleet",
                      components=full.components, stopped="budget")
    prefix = [plan.nodes[0].name if r.result == "bound" else None for r in stopped.results]
    report = as_json(stopped, models, workload="tiny", policy="gpupack", inflate=1.3, seconds=1.0,
                     following=follow_live(nodes, trace.pods, "gpupack", 42, 1.3, None, prefix))
    assert (report["complete"], report["stopped"]) == (False, "budget")
    assert report["pods_submitted"] == len(stopped.results) < report["pods_planned"]
    assert report["alloc_at_130"]["live"] is None and report["alloc_at_130"]["live_minus_simulated"] is None
    level = report["compared_at"]["level"]
    assert level == report["highest_level"] - 1 < 130
    assert report["compared_at"]["live"] == report["alloc_at"][str(level)]
    assert report["compared_at"]["simulated"] == report["simulated_alloc_at"][str(level)]
    assert report["compared_at"]["live_minus_simulated"] == round(report["compared_at"]["live"]
                                                                  - report["compared_at"]["simulated"], 2)
    assert report["model_following_live"]["pods"] == len(stopped.results)
    assert report["model_following_live"]["alloc_at_130"] is None
    assert f"STOPPED EARLY (--stop-after ran out) after {len(stopped.results)} of" in as_text(report)
    # A whole run is compared at 130 % and says nothing of stopping.
    whole = as_json(full, models, workload="tiny", policy="gpupack", inflate=1.3, seconds=1.0)
    assert (whole["complete"], whole["stopped"], whole["compared_at"]["level"]) == (True, None, 130)
    assert whole["compared_at"]["live"] == whole["alloc_at_130"]["live"]
    assert "STOPPED EARLY" not in as_text(whole)
    # Interrupted before any level was reached: nothing to compare, and it says so.
    assert compared_level({0: None, 1: None}, complete=False) is None
    assert compared_level({0: 0.0, 1: None}, complete=False) is None
    assert compared_level({0: 0.0, 1: 1.0, 2: 1.5}, complete=False) == 1


def test_stop_after_must_be_a_positive_number_of_minutes(files: tuple[Path, Path],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("0", "-5", "soon"):
        with pytest.raises(SystemExit) as exc:
            main(["replay", "--nodes", str(files[0]), "--pods", str(files[1]), "--stop-after", bad])
        assert exc.value.code == 2 and "--stop-after" in capsys.readouterr().err
