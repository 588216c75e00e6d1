"""``gpupack mig`` exit codes and output (0 yes, 1 no, 2 bad input)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpupack.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_check_fits_prints_one_placement_per_instance(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "mig", "check", "--gpu", "A100-40GB", "3g.20gb", "2g.10gb", "2g.10gb")
    assert code == 0
    assert "3g.20gb      start 4" in out
    assert out.count("start") == 3


def test_check_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "mig", "check", "--gpu", "H100", "4g.40gb", "4g.40gb", "--json")
    assert code == 1
    assert json.loads(out) == {"product": "NVIDIA-H100-80GB-HBM3", "fits": False, "instances": []}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["mig", "profiles", "--gpu", "V100"], "valid models:"),
        (["mig", "check", "--gpu", "H100", "1g.5gb"], "valid profiles: 1g.10gb"),
        (["mig", "fit", "--gpu", "H100", "--milli", "1001"], "1..1000"),
        (["mig", "fit", "--gpu", "H100", "--milli", "10", "--memory", "lots"], "is not a Kubernetes quantity"),
        (["mig", "plan", "--gpu", "H100", "--current", "3g.40gb@2", "--target", "7g.80gb"], "cannot be placed at 2:4"),
        (["mig", "plan", "--gpu", "H100", "--current", "3g.40gb", "--target", "7g.80gb"], "PROFILE@START"),
    ],
)
def test_bad_input_exits_2_naming_the_problem(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert message in err
    assert out == ""


def test_fit_no_profile_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "mig", "fit", "--gpu", "A30", "--milli", "100", "--memory", "30Gi")
    assert code == 1 and "largest is 4g.24gb" in out


def test_fit_json_has_the_resource(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "mig", "fit", "--gpu", "H100", "--milli", "250", "--memory", "12Gi", "--json")
    data = json.loads(out)
    assert code == 0 and data["best"]["resource"] == "nvidia.com/mig-2g.20gb"


def test_layouts_json_lists_maximal_layouts(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "mig", "layouts", "--gpu", "A30", "--json")
    layouts = json.loads(out)["maximal_layouts"]
    assert code == 0 and ["4g.24gb"] in layouts and ["2g.12gb", "2g.12gb"] in layouts


def test_plan_reports_steps(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "mig", "plan", "--gpu", "H100", "--current", "3g.40gb@0", "3g.40gb@4",
                       "--in-use", "3g.40gb@4", "--target", "3g.40gb", "1g.10gb", "1g.10gb", "2g.20gb", "--json")
    data = json.loads(out)
    assert code == 0
    assert data["keep"] == [{"profile": "3g.40gb", "start": 4, "size": 4}]
    assert data["destroy"] == [{"profile": "3g.40gb", "start": 0, "size": 4}]
    # With the lower 3g in use instead, 2g+1g+1g cannot fit in the upper half (1g cannot start at 7).
    code, out, _ = run(capsys, "mig", "plan", "--gpu", "H100", "--current", "3g.40gb@0", "3g.40gb@4",
                       "--in-use", "3g.40gb@0", "--target", "3g.40gb", "1g.10gb", "1g.10gb", "2g.20gb")
    assert code == 1 and "unreachable" in out


def test_config_validation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: v1\nmig-configs: {x: [{devices: all, mig-enabled: true, mig-devices: {4g.20gb: 2}, device-filter: '0x20B010DE'}]}\n")
    code, out, _ = run(capsys, "mig", "config", str(bad))
    assert code == 1 and "does not fit" in out
    broken = tmp_path / "broken.yaml"
    broken.write_text("version: v3\n")
    code, _, err = run(capsys, "mig", "config", str(broken))
    assert code == 2 and "version" in err
    code, _, err = run(capsys, "mig", "config", str(tmp_path / "missing.yaml"))
    assert code == 2 and "cannot read" in err


def test_installed_command_runs_the_showcase() -> None:
    result = subprocess.run([sys.executable, "-m", "gpupack", "mig", "showcase"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "4 step(s)" in result.stdout
