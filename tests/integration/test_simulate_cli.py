"""``gpupack simulate`` as a user runs it: a real subprocess, exit codes, text and JSON output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT.parent / "shared" / "traces" / "openb"

NODES = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(f"n{i},32000,65536,2,T4\n" for i in range(4))
PODS = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n" + "".join(
    f"p{i:02d},2000,4096,1,{m},\n" for i, m in enumerate([1000, 500, 250, 810, 470, 1000, 320, 650] * 2)
)


def gpupack(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupack", *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


@pytest.fixture()
def files(tmp_path: Path) -> tuple[Path, Path]:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "openb_pod_list_tiny.csv"
    nodes.write_text(NODES)
    pods.write_text(PODS)
    return nodes, pods


def test_json_has_the_documented_keys(files: tuple[Path, Path]) -> None:
    nodes, pods = files
    result = gpupack("simulate", "--nodes", nodes, "--pods", pods, "--policy", "fgd", "--seeds", "3", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert set(data) == {"policy", "workload", "seeds", "alloc_at", "failed_pods", "decision_us_median", "sharing_model",
                         "max_nodes", "cluster_nodes", "nodes_used", "gpus_used"}
    assert data["max_nodes"] is None and data["nodes_used"] == data["cluster_nodes"] == 4 and data["gpus_used"] == [8] * 3
    assert data["policy"] == "FGD" and data["workload"] == "openb_pod_list_tiny" and data["seeds"] == [42, 43, 44]
    assert set(data["alloc_at"]) == {str(level) for level in range(131)}
    assert all(v is None or 0 <= v <= 100 for v in data["alloc_at"].values())
    # 130 % of the capacity arrives, so some pods cannot fit (a count that could be 0 proves nothing).
    assert data["failed_pods"] > 0 and data["decision_us_median"] > 0


def test_same_seed_same_answer_and_text_table(files: tuple[Path, Path]) -> None:
    nodes, pods = files
    a = gpupack("simulate", "--nodes", nodes, "--pods", pods, "--policy", "gpupack", "--seed", "7", "--json")
    b = gpupack("simulate", "--nodes", nodes, "--pods", pods, "--policy", "gpupack", "--seed", "7", "--json")
    assert json.loads(a.stdout)["alloc_at"] == json.loads(b.stdout)["alloc_at"]
    text = gpupack("simulate", "--nodes", nodes, "--pods", pods, "--policy", "BestFit")
    assert text.returncode == 0
    assert "arrived %  allocated %" in text.stdout and "failed pods:" in text.stdout and "decision time:" in text.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--policy", "tetris"), "unknown policy 'tetris'; choose one of Random, DotProd"),
        (("--policy", "fgd", "--seeds", "0"), "--seeds must be between 1 and 1000"),
        (("--policy", "fgd", "--inflate", "-1"), "--inflate must be between"),
        (("--policy", "fgd", "--seed", "-3"), "--seed must be a non-negative integer"),
        (("--policy", "fgd", "--seed", "1", "--seeds", "2"), "not allowed with argument"),
        (("--mig", "A100-80GB", "--policy", "nos"), "unknown MIG strategy 'nos'"),
        (("--mig", "B300", "--policy", "all"), "unknown GPU model 'B300' for --mig"),
        (("--mig", "A100-80GB", "--policy", "all", "--mig-gpus", "0"), "--mig-gpus must be between"),
    ],
    ids=["unknown-policy", "zero-seeds", "negative-inflate", "negative-seed", "seed-and-seeds", "unknown-strategy", "unknown-model", "no-gpus"],
)
def test_bad_options_exit_2_with_a_clear_message(files: tuple[Path, Path], args: tuple[str, ...], message: str) -> None:
    nodes, pods = files
    result = gpupack("simulate", "--nodes", nodes, "--pods", pods, *args)
    assert result.returncode == 2
    assert message in result.stderr


def test_malformed_and_missing_files_name_file_and_line(files: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = files
    bad = tmp_path / "bad.csv"
    bad.write_text(PODS + "p99,2000,4096,1,lots,\n")
    result = gpupack("simulate", "--nodes", nodes, "--pods", bad, "--policy", "fgd")
    assert result.returncode == 2
    assert f"{bad}:18: column 'gpu_milli' must be a number, got 'lots'" in result.stderr
    missing = gpupack("simulate", "--nodes", tmp_path / "none.csv", "--pods", pods, "--policy", "fgd")
    assert missing.returncode == 2 and "none.csv: no such file" in missing.stderr
    assert "Traceback" not in result.stderr + missing.stderr


def test_mig_variant_reports_every_strategy(tmp_path: Path) -> None:
    nodes, pods = tmp_path / "n.csv", tmp_path / "openb_pod_list_timed.csv"
    nodes.write_text(NODES)
    rows = "".join(f"p{i:02d},2000,4096,1,{m},,LS,Running,{10 * i},{10 * i + 500},{10 * i}\n" for i, m in enumerate([470, 320, 1000, 110, 810, 230] * 3))
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n" + rows)
    result = gpupack("simulate", "--mig", "A100-80GB", "--nodes", nodes, "--pods", pods, "--policy", "all", "--mig-gpus", "4", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [r["strategy"] for r in data["results"]] == ["static-balanced", "static-1g", "static-whole", "greedy", "gpupack"]
    for r in data["results"]:
        assert r["placed"] + r["never_placed"] == 18
    by = {r["strategy"]: r for r in data["results"]}
    # The dynamic strategies reshape, and placing everything makes pods wait for GPUs to free up.
    assert by["greedy"]["reshapes"] > 0 and by["gpupack"]["reshapes"] > 0
    assert by["static-whole"]["mean_wait_s"] > 0 and by["static-whole"]["never_placed"] == 0
    assert by["static-1g"]["never_placed"] > 0  # 1g instances cannot hold 2g..7g requests
    assert by["static-whole"]["reshapes"] == 0
    untimed = gpupack("simulate", "--mig", "A100-80GB", "--nodes", nodes, "--pods", files_untimed(tmp_path), "--policy", "all")
    assert untimed.returncode == 2 and "needs creation_time and deletion_time" in untimed.stderr


def files_untimed(tmp_path: Path) -> Path:
    path = tmp_path / "untimed.csv"
    path.write_text(PODS)
    return path


@pytest.mark.traces
@pytest.mark.skipif(not TRACES.is_dir(), reason="openb traces not found at ../shared/traces/openb")
def test_real_trace_one_seed_runs(tmp_path: Path) -> None:
    # A few hundred pods of the real trace on the real node list keep this fast.
    pods = tmp_path / "openb_pod_list_head.csv"
    lines = (TRACES / "openb_pod_list_default.csv").read_text().splitlines()[:401]
    pods.write_text("\n".join(lines) + "\n")
    result = gpupack("simulate", "--nodes", TRACES / "openb_node_list_gpu_node.csv", "--pods", pods, "--policy", "FGD", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["workload"] == "openb_pod_list_head"
    assert max(v for v in data["alloc_at"].values() if v is not None) > 0


def test_product_model_json_keeps_the_keys_and_says_which_model_ran(files: tuple[Path, Path]) -> None:
    nodes, pods = files
    fgd = json.loads(gpupack("simulate", "--nodes", nodes, "--pods", pods, "--policy", "gpupack", "--json").stdout)
    result = gpupack("simulate", "--nodes", nodes, "--pods", pods, "--policy", "gpupack", "--model", "product", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert set(fgd) <= set(data) and fgd["sharing_model"] == "fgd" and data["sharing_model"] == "product"
    assert data["live_path"] == "engine"
    # Replicas reserve at least what the pods ask for, and never more than the cluster has.
    assert all(data["occupied_at"][k] >= v for k, v in data["alloc_at"].items() if v is not None)
    split = data["capacity_split_percent"]
    assert sum(split.values()) == pytest.approx(100.0, abs=0.1)


def test_product_model_text_and_live_path_errors(files: tuple[Path, Path]) -> None:
    nodes, pods = files
    text = gpupack("simulate", "--nodes", nodes, "--pods", pods, "--policy", "FGD", "--model", "product",
                   "--live-path", "scheduler")
    assert text.returncode == 0, text.stderr
    assert "product model, scheduler live path" in text.stdout and "occupied %" in text.stdout
    wrong = gpupack("simulate", "--nodes", nodes, "--pods", pods, "--policy", "FGD", "--live-path", "scheduler")
    assert wrong.returncode == 2 and "--model product" in wrong.stderr
    bad = gpupack("simulate", "--nodes", nodes, "--pods", pods, "--policy", "FGD", "--model", "exact")
    assert bad.returncode == 2 and "fgd" in bad.stderr and "product" in bad.stderr


def test_product_model_refuses_a_gpu_type_openb_never_had(tmp_path: Path, files: tuple[Path, Path]) -> None:
    _, pods = files
    nodes = tmp_path / "h100.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,32000,65536,8,H100\n")
    result = gpupack("simulate", "--nodes", nodes, "--pods", pods, "--policy", "FGD", "--model", "product")
    assert result.returncode == 2 and "unknown openb GPU type 'H100'" in result.stderr


def test_dra_backend_json_says_which_backend_and_unit_ran(files: tuple[Path, Path]) -> None:
    nodes, pods = files
    base = ("simulate", "--nodes", nodes, "--pods", pods, "--policy", "gpupack", "--model", "product", "--json")
    fgd = json.loads(gpupack("simulate", "--nodes", nodes, "--pods", pods, "--policy", "gpupack", "--json").stdout)
    plugin = json.loads(gpupack(*base).stdout)
    assert plugin["backend"] == "device-plugin" and "share_unit" not in plugin
    result = gpupack(*base, "--backend", "dra", "--seeds", "2")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert set(fgd) <= set(data) and data["sharing_model"] == "product"
    assert data["backend"] == "dra" and data["share_unit"] == 50 and data["live_path"] == "engine"
    assert data["cpu_pods"] == "scheduler"
    engine = json.loads(gpupack(*base, "--backend", "dra", "--cpu-pods", "engine").stdout)
    assert engine["cpu_pods"] == "engine"
    keys = list(data)
    assert keys.index("backend") == keys.index("sharing_model") + 1
    # Claims reserve at least what the pods ask for; the capacity split covers the cluster.
    assert all(data["occupied_at"][k] >= v for k, v in data["alloc_at"].items() if v is not None)
    split = data["capacity_split_percent"]
    assert set(split) == {"requested", "share_rounding", "free_on_shared_gpus", "free_gpus"}
    assert sum(split.values()) == pytest.approx(100.0, abs=0.1)
    assert len(data["gpu_modes"]) == 2 and all(sum(m.values()) == 8 for m in data["gpu_modes"])
    # The tiny trace's shares (250, 320, 470, 500, 650, 810) are multiples of 10 milli: exact at a step of 10.
    fine = json.loads(gpupack(*base, "--backend", "dra", "--share-unit", "10").stdout)
    assert fine["share_unit"] == 10 and fine["capacity_split_percent"]["share_rounding"] == 0.0


def test_dra_backend_text_names_the_backend(files: tuple[Path, Path]) -> None:
    nodes, pods = files
    text = gpupack("simulate", "--nodes", nodes, "--pods", pods, "--policy", "FGD", "--model", "product",
                   "--backend", "dra", "--share-unit", "25")
    assert text.returncode == 0, text.stderr
    assert "product model, DRA backend (shares in 25-milli steps, pods that ask for no GPU placed by kube-scheduler)" \
        in text.stdout and "occupied %" in text.stdout
    assert "share rounding" in text.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--backend", "dra"), "--backend applies to --model product only"),
        (("--model", "fgd", "--backend", "device-plugin"), "--backend applies to --model product only"),
        (("--model", "product", "--share-unit", "50"), "--share-unit applies to --backend dra only"),
        (("--model", "product", "--backend", "device-plugin", "--share-unit", "50"), "--share-unit applies to --backend dra only"),
        (("--model", "product", "--backend", "dra", "--share-unit", "300"), "--share-unit must divide 1000 milli"),
        (("--model", "product", "--backend", "dra", "--share-unit", "0"), "--share-unit must be 1..500 milli"),
        (("--model", "product", "--backend", "dra", "--share-unit", "2000"), "--share-unit must be 1..500 milli"),
        (("--model", "product", "--backend", "dra", "--share-unit", "fifty"), "argument --share-unit: invalid int value"),
        (("--model", "product", "--backend", "dra", "--live-path", "scheduler", "--cpu-pods", "engine"),
         "--cpu-pods engine needs --live-path engine"),
        (("--model", "product", "--backend", "cuda"), "argument --backend: invalid choice: 'cuda'"),
        (("--mig", "A100-80GB", "--backend", "dra"), "--backend applies to --model product only"),
        (("--model", "product", "--cpu-pods", "engine"), "--cpu-pods applies to --backend dra only"),
        (("--model", "product", "--backend", "dra", "--cpu-pods", "kubelet"), "argument --cpu-pods: invalid choice"),
    ],
    ids=["dra-without-product", "backend-with-fgd", "unit-without-backend", "unit-with-device-plugin", "unit-not-divisor",
         "unit-zero", "unit-above-a-gpu", "unit-not-a-number", "unguided-with-cpu-engine", "unknown-backend", "backend-with-mig",
         "cpu-pods-without-dra", "cpu-pods-unknown"],
)
def test_backend_flags_exit_2_with_a_clear_message(files: tuple[Path, Path], args: tuple[str, ...], message: str) -> None:
    nodes, pods = files
    result = gpupack("simulate", "--nodes", nodes, "--pods", pods, "--policy", "FGD", *args)
    assert result.returncode == 2, result.stdout
    assert message in result.stderr and "Traceback" not in result.stderr


def test_dra_unguided_is_kube_scheduler_and_first_fit_and_says_so(files: tuple[Path, Path]) -> None:
    """``--backend dra --live-path scheduler``: the same slices without gpupack's pins; no policy is
    consulted, so the policy named makes no difference and the text says there is none."""
    nodes, pods = files
    base = ("simulate", "--nodes", nodes, "--pods", pods, "--model", "product", "--backend", "dra",
            "--live-path", "scheduler", "--seeds", "2")
    runs = [json.loads(gpupack(*base, "--policy", policy, "--json").stdout) for policy in ("FGD", "gpupack")]
    assert runs[0]["live_path"] == runs[1]["live_path"] == "scheduler"
    assert runs[0]["alloc_at"] == runs[1]["alloc_at"]
    text = gpupack(*base, "--policy", "FGD")
    assert text.returncode == 0, text.stderr
    assert "policy none (unguided)" in text.stdout and "kube-scheduler unguided" in text.stdout
