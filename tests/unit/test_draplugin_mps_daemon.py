"""The plugin's MPS control daemon (node.draplugin.mps_daemon) against a stand-in program that
behaves as ``nvidia-cuda-mps-control`` does for what gpupack uses (tests/fixtures/fake_mps_control.py)."""

from __future__ import annotations

import stat
import sys
import threading
from pathlib import Path

import pytest

from node.draplugin.mps_daemon import MpsDaemon, MpsDaemonError, watch
from tests.e2e.waiting import wait_for

FAKE = Path(__file__).resolve().parents[1] / "fixtures" / "fake_mps_control.py"


def daemon(tmp_path: Path, binary: str | None = None) -> MpsDaemon:
    program = tmp_path / "mps-control"
    program.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    return MpsDaemon(tmp_path / "pipes", tmp_path / "log", ["GPU-a", "GPU-b"], binary=binary or str(program),
                     start_timeout_s=10.0)


def test_started_with_the_pipe_directory_and_only_the_mig_off_gpus_then_quit(tmp_path: Path) -> None:
    mps = daemon(tmp_path)
    mps.start()
    assert mps.running() and mps.starts == 1
    assert (tmp_path / "pipes" / "devices").read_text() == "GPU-a,GPU-b"
    assert (tmp_path / "log" / "control.log").exists()
    mps.start()  # running already: used as it is
    assert mps.starts == 1
    mps.stop()
    assert not mps.running()
    mps.stop()  # nothing to quit: no error


def test_a_daemon_that_went_is_started_again_by_the_watcher(tmp_path: Path) -> None:
    mps = daemon(tmp_path)
    mps.start()
    stop = threading.Event()
    watch(mps, stop, every_s=0.1)
    try:
        (tmp_path / "pipes" / "control").unlink()  # it died
        wait_for("the daemon started again", lambda: mps.starts == 2 and mps.running(), 20.0)
    finally:
        stop.set()
        mps.stop()


def test_a_program_that_is_missing_or_fails_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(MpsDaemonError, match="could not be run"):
        daemon(tmp_path, binary=str(tmp_path / "no-such-program")).start()
    failing = tmp_path / "failing"
    failing.write_text("#!/bin/sh\necho 'no GPU to run on' >&2\nexit 3\n")
    failing.chmod(0o755)
    with pytest.raises(MpsDaemonError, match="exited 3: no GPU to run on"):
        daemon(tmp_path, binary=str(failing)).start()
    silent = tmp_path / "silent"
    silent.write_text("#!/bin/sh\nexit 0\n")
    silent.chmod(0o755)
    quick = daemon(tmp_path, binary=str(silent))
    quick.start_timeout_s = 0.3
    with pytest.raises(MpsDaemonError, match="did not appear"):
        quick.start()
    assert not quick.check()  # a failed restart is logged, not raised
