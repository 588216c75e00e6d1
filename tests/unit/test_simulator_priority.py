"""``gpupack simulate --model product --priority``: openb's qos as priorities, preemption in the product model
(sharing.simulator.preempting), on a small synthetic openb-like trace so the tests need no trace files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpupack.cli import main
from sharing.api.priority import PodPriority
from sharing.packing.specs import PodSpec
from sharing.rules.priority import qos_priority
from sharing.simulator.preempting import own_size
from sharing.simulator.product import ProductRun, engine_view, run_product
from sharing.simulator.scheduler_config import load_weights
from sharing.simulator.tally import ArrivalTally
from sharing.simulator.traces import TraceError, load_nodes, load_pods, load_qos
from sharing.simulator.workload import trace_name

QOS = ("LS", "BE", "Burstable", "Guaranteed")


def write_trace(folder: Path, pods: int = 260, qos: bool = True, seed: int = 3) -> tuple[Path, Path]:
    """A node list of 16 nodes and a pod list of ``pods`` openb-like pods (a ``qos`` column unless not)."""
    rng = np.random.default_rng(seed)
    nodes = folder / "nodes.csv"
    rows = ["sn,cpu_milli,memory_mib,gpu,model"]
    for i in range(16):
        gpus = (2, 4, 8)[i % 3]
        rows.append(f"node-{i:02d},{(32_000, 64_000, 96_000)[i % 3]},262144,{gpus},{('T4', 'P100')[i % 2]}")
    nodes.write_text("\n".join(rows) + "\n")
    pod_list = folder / "pods.csv"
    rows = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec" + (",qos" if qos else "")]
    for i in range(pods):
        kind = rng.integers(0, 10)
        count, milli = (1, 1000) if kind < 4 else (2, 1000) if kind == 4 else (1, int(rng.choice([100, 200, 250, 300, 500])))
        cls = QOS[int(rng.choice(4, p=[0.55, 0.4, 0.04, 0.01]))]
        rows.append(f"pod-{i:04d},{int(rng.integers(1000, 8000))},4096,{count},{milli}," + (f",{cls}" if qos else ""))
    pod_list.write_text("\n".join(rows) + "\n")
    return nodes, pod_list


def priorities(pod_list: Path) -> dict[str, PodPriority]:
    qos = load_qos(pod_list)
    assert qos is not None
    return {name: qos_priority(value) for name, value in qos.items()}


def run(nodes: Path, pod_list: Path, seed: int = 42, **kwargs: object) -> ProductRun:
    return run_product(load_nodes(nodes), load_pods(pod_list).pods, "gpupack", seed, load_weights(), **kwargs)  # type: ignore[arg-type]


def test_priority_none_is_the_run_without_priorities(tmp_path: Path) -> None:
    nodes, pod_list = write_trace(tmp_path)
    for seed in (42, 43):
        plain = run(nodes, pod_list, seed)
        none = run(nodes, pod_list, seed, priorities=priorities(pod_list), preemption="none")
        assert plain.priority is None and none.priority is not None
        assert (none.alloc_at, none.occupied_at, none.failed_pods, none.split, none.node_modes) == (
            plain.alloc_at, plain.occupied_at, plain.failed_pods, plain.split, plain.node_modes)
        assert none.priority.preemptions == 0 and none.priority.preempted_milli == 0


@pytest.mark.parametrize("mode", ["engine", "scheduler"])
def test_preemption_places_more_of_the_high_classes_and_keeps_the_rules(tmp_path: Path, mode: str) -> None:
    nodes, pod_list = write_trace(tmp_path)
    classes = priorities(pod_list)
    none = run(nodes, pod_list, priorities=classes, preemption="none").priority
    ran = run(nodes, pod_list, priorities=classes, preemption=mode)
    figures = ran.priority
    assert none is not None and figures is not None
    assert figures.preemptions > 0 and figures.preempted_pods >= figures.preemptions
    assert figures.equal_or_higher == 0 and figures.loops == 0
    assert figures.placed_by_class["LS"] > none.placed_by_class["LS"]
    assert figures.placed_by_class["BE"] < none.placed_by_class["BE"]
    assert set(figures.alloc_at_by_class) <= set(QOS)
    be = [v for v in figures.alloc_at_by_class["BE"].values() if v is not None]
    assert be and all(0 <= v <= 100 for v in be)
    if mode == "scheduler":
        assert set(figures.reasons) == {"scheduler-default"}


def test_a_victim_leaves_the_allocation_and_counts_as_failed() -> None:
    tally = ArrivalTally(3)
    a, b = PodSpec("a", 1000, 1024, 1, 400), PodSpec("b", 1000, 1024, 1, 1000)
    tally.record(0, a, 500.0, 0)
    tally.withdraw(a.gpu_total_milli, 500.0)  # b preempts a
    tally.record(1, b, 1000.0, 0)
    figures = tally.figures(total_gpus=1)
    assert figures["failed_pods"] == 1 and figures["final_alloc_percent"] == 100.0
    assert list(tally.used[:2]) == [400, 1000] and list(tally.occupied[:2]) == [500, 1000]


def test_clones_take_their_pods_class() -> None:
    assert trace_name("openb-pod-0001-clone-17") == "openb-pod-0001"
    assert trace_name("openb-pod-0001") == "openb-pod-0001"


def test_preemption_needs_priorities(tmp_path: Path) -> None:
    nodes, pod_list = write_trace(tmp_path)
    with pytest.raises(ValueError, match="needs the pods' priorities"):
        run(nodes, pod_list, preemption="engine")
    with pytest.raises(ValueError, match="no priority for pod"):
        run(nodes, pod_list, priorities={"pod-0000": qos_priority("LS")}, preemption="engine")


def test_the_qos_column_is_read_where_there_is_one(tmp_path: Path) -> None:
    _, pod_list = write_trace(tmp_path, pods=5)
    assert set((load_qos(pod_list) or {}).values()) <= set(QOS)
    (tmp_path / "bare").mkdir()
    _, bare = write_trace(tmp_path / "bare", pods=5, qos=False)
    assert load_qos(bare) is None
    empty = tmp_path / "empty.csv"
    empty.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,qos\np,1000,1024,1,500,\n")
    with pytest.raises(TraceError, match="empty.csv:2: empty qos for pod 'p'"):
        load_qos(empty)


def simulate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["simulate", "--policy", "gpupack", "--seed", "42", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_cli_reports_classes_and_preemptions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pod_list = write_trace(tmp_path)
    base = ["--nodes", str(nodes), "--pods", str(pod_list), "--model", "product", "--json"]
    _, plain, _ = simulate(capsys, *base)
    _, none, _ = simulate(capsys, *base, "--priority", "none")
    _, qos, _ = simulate(capsys, *base, "--priority", "qos")
    _, sched, _ = simulate(capsys, *base, "--priority", "qos", "--preemption", "scheduler")
    plain_j, none_j, qos_j, sched_j = (json.loads(x) for x in (plain, none, qos, sched))
    assert "alloc_at_by_class" not in plain_j
    assert none_j["alloc_at"] == plain_j["alloc_at"] and none_j["preemptions"] == 0
    assert qos_j["preemption"] == "engine" and sched_j["preemption"] == "scheduler"
    for key in ("alloc_at_by_class", "preemptions", "preempted_milli", "placed_by_class"):
        assert key in qos_j
    assert qos_j["preemptions"] > 0 and qos_j["preempted_equal_or_higher"] == 0 and qos_j["preemption_loops"] == 0
    assert set(qos_j["alloc_at_by_class"]["LS"]) == set(qos_j["alloc_at"])
    _, text, _ = simulate(capsys, *base[:-1], "--priority", "qos")
    assert "preemptions (engine):" in text and "placed at the end, % of each class's arrived milli" in text


@pytest.mark.parametrize(("extra", "words"), [
    (["--preemption", "engine"], "--preemption applies to --priority qos only"),
    (["--priority", "none", "--preemption", "scheduler"], "--preemption applies to --priority qos only"),
    (["--priority", "qos", "--model", "fgd"], "--priority applies to --model product with the device-plugin backend"),
    (["--priority", "qos", "--backend", "dra"], "--priority applies to --model product with the device-plugin backend"),
], ids=["no-priority", "priority-none", "fgd", "dra"])
def test_flags_that_do_not_apply_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str],
                                             words: str) -> None:
    nodes, pod_list = write_trace(tmp_path, pods=20)
    args = ["--nodes", str(nodes), "--pods", str(pod_list)]
    if "--model" not in extra:
        args += ["--model", "product"]
    code, _, err = simulate(capsys, *args, *extra)
    assert code != 0 and words in err


def test_a_trace_without_classes_or_with_an_unknown_one_is_refused(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    nodes, bare = write_trace(tmp_path, pods=20, qos=False)
    code, _, err = simulate(capsys, "--nodes", str(nodes), "--pods", str(bare), "--model", "product", "--priority", "qos")
    assert code != 0 and "has no qos column" in err
    odd = tmp_path / "odd.csv"
    odd.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,qos\np,1000,1024,1,500,Spot\n")
    code, _, err = simulate(capsys, "--nodes", str(nodes), "--pods", str(odd), "--model", "product", "--priority", "qos")
    assert code != 0 and "pod 'p': qos 'Spot' is unknown" in err


def test_own_size_is_the_replica_count_who_places_the_pod_gives_it() -> None:
    """``make_room`` and benchmarks/priority_shortfall.py read a fractional pod's replica size from one rule."""
    third, most = PodSpec("f", 1000, 1024, 1, 300), PodSpec("m", 1000, 1024, 1, 700)
    assert own_size(third, third, "engine") == 3  # the engine splits as finely as 300 milli allows
    assert own_size(third, third, "scheduler") == 3
    # Above half a GPU the engine places the pod as a whole GPU: no replica size.
    assert own_size(most, engine_view([most], "engine")[0], "engine") == 0
    assert own_size(most, most, "scheduler") == 1
    whole = PodSpec("w", 1000, 1024, 2, 1000)
    assert own_size(whole, whole, "engine") == 0
