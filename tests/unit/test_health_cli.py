"""``gpupack agent fault`` and ``gpupack agent health check-xid-table``: what they post and print, and their refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupack.cli import main
from mig.catalog import get_model
from node.nvml.simulated import SimulatedNvml, inbox_path, take_inbox

H100 = get_model("H100-80GB")


@pytest.fixture()
def state(tmp_path: Path) -> Path:
    path = tmp_path / "node.json"
    sim = SimulatedNvml(H100, 2, path, seed="n")
    profile = H100.profile("3g.40gb")
    sim.create_gpu_instance(1, profile.profile_id, profile.placements[0])
    return path


def test_a_fault_is_posted_to_the_inbox_and_applied_by_the_backend(state: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "fault", "--state-file", str(state), "xid", "--gpu", "1", "--xid", "94",
                 "--instance", "1"]) == 0
    assert main(["agent", "fault", "--state-file", str(state), "ecc", "--gpu", "0", "--count", "3"]) == 0
    assert "next tick" in capsys.readouterr().out
    sim = SimulatedNvml(H100, 2, state, seed="n")  # the running agent's backend, as it reads its inbox
    assert sim.read_inbox() == 2
    (event,) = sim.xid_events()
    assert (event.gpu_index, event.xid, event.gi_id) == (1, 94, 1)
    assert sim.memory_health(0).volatile_uncorrected == 3
    assert take_inbox(inbox_path(state)) == []  # consumed


@pytest.mark.parametrize(("argv", "message"), [
    (["xid", "--gpu", "2", "--xid", "79"], "GPUs 0..1"),
    (["xid", "--gpu", "0"], "needs --xid"),
    (["xid", "--gpu", "0", "--xid", "0"], "1..65535"),
    (["xid", "--gpu", "1", "--xid", "94", "--instance", "9"], "GPU 1 has GPU instances 1"),
    (["ecc", "--gpu", "0", "--count", "0"], "at least 1"),
    (["lose"], "needs --gpu"),
])
def test_bad_faults_are_refused_and_nothing_is_posted(state: Path, argv: list[str], message: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "fault", "--state-file", str(state), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not inbox_path(state).exists()


def test_a_file_that_is_not_a_simulated_state_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "x.json"
    other.write_text('{"gpus": []}')
    assert main(["agent", "fault", "--state-file", str(other), "reboot"]) == 2
    assert "not a simulated NVML state file" in capsys.readouterr().err


def test_check_xid_table_prints_the_table_in_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = tmp_path / "xids.yaml"
    table.write_text("- {xid: 13, action: unhealthy, recovery: RebootNode, description: ours}\n")
    assert main(["agent", "health", "check-xid-table", str(table)]) == 0
    out = capsys.readouterr().out
    assert "*    13  unhealthy    RebootNode   ours" in out and "1 override(s)" in out
    assert "   79  unhealthy    RebootNode" in out
    table.write_text("- {xid: 13, action: sometimes}\n")
    assert main(["agent", "health", "check-xid-table", str(table)]) == 2
    assert "entry 0 (xid 13): action must be one of application, unhealthy" in capsys.readouterr().err
