"""The stack's components get ServiceAccount tokens that outlive a long run (gpupack.demo.stack)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpupack.demo.stack import COMPONENT_TOKEN_SECONDS, Stack


class Plane:
    """Records what the stack asks of the control plane's TokenRequest."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []

    def serviceaccount_kubeconfig(self, name: str, namespace: str = "gpupack-system", seconds: int = 3600) -> Path:
        self.asked.append((name, seconds))
        return Path(f"/sa/{name}.kubeconfig")


def test_controller_and_webhook_tokens_outlive_a_whole_cluster_replay(tmp_path: Path) -> None:
    plane: Any = Plane()
    stack = Stack(tmp_path, plane=plane)
    assert stack._sa_kubeconfig("gpupack-controller") == "/sa/gpupack-controller.kubeconfig"
    (name, seconds), = plane.asked
    # A whole-cluster replay ran for hours; the control plane's default of one hour cut it off.
    assert name == "gpupack-controller" and seconds == COMPONENT_TOKEN_SECONDS >= 24 * 3600
