"""``gpupack agent ... --usage-trace``: a simulated node plays a trace; bad input is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpupack.cli import main
from gpupack.testing.usage_traces import GIB, write_usage_trace
from sharing.usage.trace import DUTY_FILE


def _trace(tmp_path: Path) -> Path:
    return write_usage_trace(tmp_path / "trace", {"p1": [(10.0, GIB), (20.0, 2 * GIB)]})


def test_a_simulated_node_plays_the_trace_and_keeps_its_start(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "s.json"
    args = ["agent", "snapshot", "--simulate", "T4:1", "--state-file", str(state), "--usage-trace",
            str(_trace(tmp_path)), "--usage-trace-start", "1234.5"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["backend"] == "simulated"
    assert json.loads(state.read_text())["trace_start"] == 1234.5


@pytest.mark.parametrize(("extra", "message"), [
    (["--usage-trace", "missing"], "missing: no such folder"),
    (["--usage-trace", "trace", "--bad-trace"], f"{DUTY_FILE}:1: missing column(s) container_ip"),
    (["--usage-trace", "trace", "--usage-trace-pods", "map.csv"], "map.csv:2: pod must be namespace/name"),
    (["--usage-trace", "trace", "--usage-trace-pods", "ghost.csv"],
     "pod mapping names trace pod(s) the trace does not hold: ghost"),
    (["--usage-trace", "trace", "--no-simulate"], "usage_trace and usage_trace_pods are for simulated nodes only"),
], ids=["missing-folder", "unreadable-trace", "bad-mapping", "unknown-trace-pod", "not-simulated"])
def test_bad_input_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str],
                                          message: str) -> None:
    trace = _trace(tmp_path)
    (tmp_path / "map.csv").write_text("pod,container_ip\nnot-namespaced,p1\n")
    (tmp_path / "ghost.csv").write_text("pod,container_ip\nml/a,ghost\n")
    if "--bad-trace" in extra:
        extra.remove("--bad-trace")
        (trace / DUTY_FILE).write_text("value,timestamp_anon\n1,2\n")
    simulate = [] if "--no-simulate" in extra else ["--simulate", "T4:1"]
    extra = [str(tmp_path / a) if a in ("missing", "trace", "map.csv", "ghost.csv") else a
             for a in extra if a != "--no-simulate"]
    assert main(["agent", "snapshot", *simulate, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("scale", ["0", "-60", "nan"])
def test_a_time_scale_of_zero_or_less_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 scale: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["agent", "snapshot", "--simulate", "T4:1", "--usage-trace", str(_trace(tmp_path)),
              "--usage-time-scale", scale])
    assert exited.value.code == 2
    assert "argument --usage-time-scale" in capsys.readouterr().err


def test_a_time_scale_of_zero_from_the_environment_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPACK_AGENT_USAGE_TIME_SCALE", "0")
    assert main(["agent", "snapshot", "--simulate", "T4:1", "--usage-trace", str(_trace(tmp_path))]) == 2
    assert "usage_time_scale must be above 0" in capsys.readouterr().err
