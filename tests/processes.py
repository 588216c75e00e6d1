"""Helpers for tests that start the product's own processes."""

from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited after ``grace_s`` (a hung test server must not hang the suite)."""
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
