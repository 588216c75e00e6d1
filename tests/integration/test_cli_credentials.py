"""Every component that talks to Kubernetes reports unusable credentials as a usage error, not a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupack.cli import main
from gpupack.devcluster.process import free_port
from webhook.certs import write_self_signed


@pytest.fixture
def missing_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return str(tmp_path / "no-such-kubeconfig.yaml")


def test_webhook_serve(tmp_path: Path, missing_kubeconfig: str, capsys: pytest.CaptureFixture[str]) -> None:
    _ca, cert, key = write_self_signed(tmp_path / "tls", "gpupack-webhook", "gpupack-system", [])
    code = main(["webhook", "serve", "--tls-cert", str(cert), "--tls-key", str(key), "--port", str(free_port()),
                 "--kubeconfig", missing_kubeconfig])
    assert code == 2
    assert f"cannot load Kubernetes credentials from {missing_kubeconfig}" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["controller", "run"], ["agent", "run", "--node", "n1"]])
def test_long_running_components(argv: list[str], missing_kubeconfig: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main([*argv, "--kubeconfig", missing_kubeconfig])
    assert code == 2
    assert f"cannot load Kubernetes credentials from {missing_kubeconfig}" in capsys.readouterr().err


def test_controller_plan(missing_kubeconfig: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["controller", "plan", "--kubeconfig", missing_kubeconfig]) == 2
    assert f"cannot load Kubernetes credentials from {missing_kubeconfig}" in capsys.readouterr().err
