"""``mypy --strict`` over every package of gpupack must stay clean (STYLE.md: typed code)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["mig", "sharing", "webhook", "node", "controller", "gpupack", "kube"]


def test_packages_are_mypy_strict_clean() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", *PACKAGES],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
