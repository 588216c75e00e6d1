"""``gpupack simulate usage`` on small synthetic traces: its JSON, its refusals, and ``simulate`` beside it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpupack.cli import main
from sharing.usage.trace import DUTY_FILE, MEMORY_FILE

GIB = 2**30


def write_trace(folder: Path, pods: int = 3, steps: int = 200, duty_rows: list[str] | None = None) -> Path:
    folder.mkdir(exist_ok=True)
    duty = ["value,timestamp_anon,container_ip"]
    memory = ["timestamp_anon,value,container_ip"]
    for step in range(steps):
        for pod in range(pods):
            duty.append(f"{5.0 + pod},{1000.0 + 60 * step},pod{pod}")
            memory.append(f"{1000.0 + 60 * step},{10 * GIB},pod{pod}")
    (folder / DUTY_FILE).write_text("\n".join(duty + (duty_rows or [])) + "\n")
    (folder / MEMORY_FILE).write_text("\n".join(memory) + "\n")
    return folder


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main(["simulate", "usage", *args, "--json"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_the_json_carries_the_issues_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "t")
    out = run_json(capsys, "--trace", str(trace), "--gpu", "H100-80GB")
    for key in ("pods", "gpu_hours_baseline", "gpu_hours", "gpu_hours_saved_pct", "oracle_gpu_hours_saved_pct",
                "saturated_gpu_minutes_pct", "gpu_memory_overflow_minutes", "pod_minutes_over_limit_pct",
                "evictions_per_pod_day", "static"):
        assert key in out, key
    assert out["pods"] == 3 and out["mode"] == "recreate" and out["gpu"] == "NVIDIA-H100-80GB-HBM3"
    assert isinstance(out["gpu_hours_saved_pct"], float) and out["gpu_hours_saved_pct"] > 0


def test_off_saves_nothing_and_the_bad_rows_are_counted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "t", duty_rows=["nan,1000.0,pod0", "-3,1060.0,pod1"])
    out = run_json(capsys, "--trace", str(trace), "--gpu", "H200-141GB", "--mode", "off", "--seed", "7")
    assert out["gpu_hours_saved_pct"] == 0.0 and out["seed"] == 7
    counts = out["trace"]
    assert isinstance(counts, dict)
    assert counts["duty"]["duplicate"] == 2  # both land on samples already read
    assert counts["duty"]["nan"] == 1 and counts["duty"]["negative"] == 1


def test_workloads_group_pods(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "t")
    groups = tmp_path / "w.csv"
    groups.write_text("container_ip,workload\npod0,sd\npod1,sd\n")
    out = run_json(capsys, "--trace", str(trace), "--gpu", "H100-80GB", "--workloads", str(groups))
    assert out["pods"] == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu", "H300"], "unknown GPU model 'H300'; valid models:"),
        (["--gpu", "H100", "--trace", "missing"], "missing: no such folder"),
        (["--gpu", "H100", "--workloads", "w.csv"], "w.csv:2: pod 'ghost' is not in the trace"),
        (["--gpu", "H100", "--bad-duty"], ":1: missing column(s) container_ip"),
        (["--gpu", "H100", "--learn-minutes", "-5"], "--learn-minutes must be between 0 and 1440, got -5"),
        (["--gpu", "H100", "--duty-quantile", "1.5"], "--duty-quantile must be between 0.5 and 1, got 1.5"),
        (["--gpu", "H100", "--oom-bump", "0.9"], "--oom-bump must be between 1 and 3, got 0.9"),
        (["--gpu", "H100", "--max-drains", "-1"], "--max-drains must not be negative, got -1"),
        (["--gpu", "H100", "--draws", "-1"], "--draws must be between 0 and 1000, got -1"),
        (["--gpu", "H100", "--draws", "2", "--missed-samples", "1"], "--missed-samples must be at least 0 and below 1"),
        (["--gpu", "H100", "--missed-samples", "0.1"], "--missed-samples needs --draws N"),
    ],
    ids=["unknown-gpu", "no-trace", "unknown-pod", "missing-column", "learn-minutes", "duty-quantile", "oom-bump",
         "max-drains", "draws", "missed-samples", "missed-without-draws"],
)
def test_bad_input_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                          message: str) -> None:
    trace = write_trace(tmp_path / "t")
    (tmp_path / "w.csv").write_text("container_ip,workload\nghost,sd\n")
    if "--bad-duty" in args:
        args.remove("--bad-duty")
        (trace / DUTY_FILE).write_text("value,timestamp_anon\n1,2\n")
    if "--trace" not in args:
        args += ["--trace", str(trace)]
    args = [str(tmp_path / a) if a in ("missing", "w.csv") else a for a in args]
    assert main(["simulate", "usage", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_simulate_still_asks_for_its_own_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["simulate", "--nodes", "n.csv"])
    assert exited.value.code == 2
    assert "the following arguments are required: --pods, --policy" in capsys.readouterr().err


def test_openb_flags_do_not_mix_with_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "t")
    assert main(["simulate", "--policy", "fgd", "usage", "--trace", str(trace), "--gpu", "H100"]) == 2
    assert "belong to `gpupack simulate`" in capsys.readouterr().err


def test_the_text_table_shows_run_and_static(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "usage", "--trace", str(write_trace(tmp_path / "t")), "--gpu", "H100"]) == 0
    text = capsys.readouterr().out
    assert "gpu_hours_saved_pct" in text and "static" in text and "oracle_gpu_hours_saved_pct" in text


def test_the_right_sizers_settings_are_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "t", pods=4, steps=200)
    quick = run_json(capsys, "--trace", str(trace), "--gpu", "H100-80GB", "--learn-minutes", "10")
    slow = run_json(capsys, "--trace", str(trace), "--gpu", "H100-80GB", "--learn-minutes", "120")
    assert isinstance(quick["gpu_hours_saved_pct"], float) and isinstance(slow["gpu_hours_saved_pct"], float)
    assert quick["gpu_hours_saved_pct"] > slow["gpu_hours_saved_pct"]  # less time on a whole GPU
    summed = run_json(capsys, "--trace", str(trace), "--gpu", "H100-80GB", "--learn-minutes", "10",
                      "--compute-overcommit", "2", "--duty-quantile", "0.999", "--memory-margin", "0",
                      "--first-memory-margin", "0", "--oom-bump", "1.2", "--oom-floor", "--max-drains", "2")
    assert summed["gpu_memory_overflow_minutes"] == 0.0 and summed["pods"] == 4


def test_draws_summarise_runs_with_observation_noise(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "t", pods=4)
    plain = run_json(capsys, "--trace", str(trace), "--gpu", "H100-80GB", "--backend", "device-plugin",
                     "--publish-seconds", "300")
    out = run_json(capsys, "--trace", str(trace), "--gpu", "H100-80GB", "--backend", "device-plugin",
                   "--publish-seconds", "300", "--draws", "3", "--missed-samples", "0.2", "--seed", "7")
    drawn = out["draws"]
    assert isinstance(drawn, dict)
    assert drawn["count"] == 3 and drawn["seed"] == 7 and drawn["missed_samples"] == 0.2
    saved = drawn["gpu_hours_saved_pct"]
    assert len(saved) == 3
    assert drawn["min"]["gpu_hours_saved_pct"] == min(saved) <= drawn["mean"]["gpu_hours_saved_pct"] <= max(saved)
    assert {k: v for k, v in out.items() if k != "draws"} == {**plain, "seed": 7}  # the run itself draws nothing
