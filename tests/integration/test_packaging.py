"""gpupack as a release ships it: an sdist, a wheel built from that sdist, installed with its pinned
dependencies into a clean virtual environment (not the editable checkout), and run from there."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
PACKAGES = ("gpupack", "mig", "sharing", "webhook", "node", "controller", "kube")


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # Both: the sdist first, then the wheel built from the unpacked sdist, so a file the
    # sdist forgets breaks the wheel too.
    built = subprocess.run([sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(ROOT)],
                           capture_output=True, text=True, timeout=600, cwd=out)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    return out


def test_the_sdist_holds_the_sources_and_the_package_data(dist: Path) -> None:
    with tarfile.open(dist / f"gpupack-{VERSION}.tar.gz") as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert {"pyproject.toml", "README.md"} <= names
    for package in PACKAGES:
        assert f"{package}/__init__.py" in names, package
        assert f"{package}/py.typed" in names, package  # package data: typed for mypy users


def test_the_wheel_installs_into_a_clean_environment_and_runs(dist: Path, tmp_path: Path) -> None:
    env = tmp_path / "venv"
    # A clean environment: nothing of this one's site-packages. The dependencies are the
    # pinned ones the image ships (tools/image/requirements.lock; from pip's cache when warm).
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    wheel = dist / f"gpupack-{VERSION}-py3-none-any.whl"
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                                "-r", str(ROOT / "tools" / "image" / "requirements.lock"), str(wheel)],
                               capture_output=True, text=True, timeout=900)
    assert installed.returncode == 0, installed.stderr[-3000:]
    where = subprocess.run([str(python), "-c", "import " + ", ".join(PACKAGES) + "; "
                            "print('\\n'.join(m.__file__ for m in (" + ", ".join(PACKAGES) + ")))"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    for path in where.stdout.split():
        assert Path(path).is_relative_to(env), f"{path}: not the wheel's copy"
    version = subprocess.run([str(env / "bin" / "gpupack"), "--version"], capture_output=True, text=True,
                             timeout=60, cwd=tmp_path)
    assert version.stdout.strip() == f"gpupack {VERSION}", version.stderr
    for path in where.stdout.split():
        assert (Path(path).parent / "py.typed").is_file(), path  # package data travels in the wheel
    fit = subprocess.run([str(env / "bin" / "gpupack"), "mig", "fit", "--gpu", "H100", "--milli", "250"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert fit.returncode == 0 and "resource nvidia.com/mig-" in fit.stdout, fit.stdout + fit.stderr
