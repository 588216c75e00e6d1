"""``gpupack agent ...``: exit codes and messages for good and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpupack.cli import main


def test_snapshot_of_a_simulated_node(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    state = tmp_path / "s.json"
    assert main(["agent", "snapshot", "--simulate", "A30:3", "--state-file", str(state), "--node", "n7"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["backend"] == "simulated" and len(out["gpus"]) == 3
    assert out["gpus"][0]["model"] == "NVIDIA-A30" and out["gpus"][0]["device"]["mig_enabled"] is True
    assert state.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["agent", "snapshot", "--simulate", "H900:2"], "unknown GPU model 'H900'"),
        (["agent", "snapshot", "--simulate", "H200"], "MODEL:COUNT"),
        (["agent", "snapshot", "--simulate", "H200:0"], "1..16"),
        (["agent", "snapshot", "--simulate", "H200:two"], "not an integer"),
        (["agent", "run", "--simulate", "H200:1"], "--node"),
        (["agent", "run", "--node", "n", "--emulate-device-plugin"], "simulated nodes only"),
        (["agent", "run", "--node", "n", "--simulate", "H200:1", "--kubeconfig", "/nonexistent/kubeconfig"],
         "cannot load Kubernetes credentials"),
        (["agent", "run", "--node", "n", "--mode", "sideways"], "invalid choice"),
    ],
    ids=["unknown-model", "no-count", "zero-gpus", "count-not-int", "no-node", "emulate-real", "bad-kubeconfig",
         "bad-mode"],
)
def test_bad_input_exits_2_with_a_reason(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        raise SystemExit(main(argv))
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_snapshot_without_nvml_exits_1(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from node.nvml import errors
    from node.nvml.errors import NvmlError
    from node.nvml.real import RealNvml

    def no_driver() -> RealNvml:
        raise NvmlError(errors.LIBRARY_NOT_FOUND, "no libnvidia-ml")

    monkeypatch.setattr(RealNvml, "open", staticmethod(no_driver))  # also true on GPU machines
    assert main(["agent", "snapshot"]) == 1
    assert "NVML could not be opened" in capsys.readouterr().err


def test_environment_settings_reach_the_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GPUPACK_AGENT_SIMULATE", "H100:2")
    assert main(["agent", "snapshot"]) == 0
    assert len(json.loads(capsys.readouterr().out)["gpus"]) == 2
    monkeypatch.setenv("GPUPACK_AGENT_POLL_SECONDS", "-1")
    with pytest.raises(SystemExit) as exited:
        raise SystemExit(main(["agent", "snapshot"]))
    assert exited.value.code == 2 and "poll_seconds must be positive" in capsys.readouterr().err


def test_the_old_name_still_works_with_a_warning(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["agent", "inventory", "--simulate", "A30:1", "--state-file", str(tmp_path / "s.json")]) == 0
    out, err = capsys.readouterr()
    assert len(json.loads(out)["gpus"]) == 1
    assert "'agent inventory' is deprecated; use 'agent snapshot'" in err
