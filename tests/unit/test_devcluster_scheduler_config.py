"""The dev cluster's kube-scheduler runs the shipped packing configuration, not a copy of it.

``manifests/scheduler/kube-scheduler-config.yaml`` is the one source of truth:
the file the dev cluster writes may differ from it only in the kubeconfig path
and in leader election, and the command line must point kube-scheduler at it.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from gpupack.devcluster import components
from gpupack.devcluster.binaries import Binaries

SHIPPED = Path(__file__).resolve().parents[2] / "manifests" / "scheduler" / "kube-scheduler-config.yaml"


def _without_local_changes(config: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(config)
    out.get("clientConnection", {}).pop("kubeconfig", None)
    out.pop("leaderElection", None)
    out.pop("extenders", None)
    return out


def test_generated_scheduler_config_equals_the_shipped_one_but_for_local_settings(tmp_path: Path) -> None:
    shipped = yaml.safe_load(SHIPPED.read_text(encoding="utf-8"))
    written = yaml.safe_load(components.write_scheduler_config(tmp_path).read_text(encoding="utf-8"))
    assert _without_local_changes(written) == _without_local_changes(shipped)
    # The profiles (MostAllocated, GPU weights) are exactly as shipped.
    assert written["profiles"] == shipped["profiles"]
    strategy = written["profiles"][0]["pluginConfig"][0]["args"]["scoringStrategy"]
    assert strategy["type"] == "MostAllocated"
    assert written["clientConnection"]["kubeconfig"] == str(tmp_path / "scheduler.kubeconfig")
    assert written["leaderElection"] == {"leaderElect": False}


def test_without_a_local_webhook_the_extender_is_left_out(tmp_path: Path) -> None:
    shipped = yaml.safe_load(SHIPPED.read_text(encoding="utf-8"))
    assert [e["prioritizeVerb"] for e in shipped["extenders"]] == ["prioritize"]
    assert "extenders" not in components.scheduler_config(tmp_path)


def test_the_local_webhook_serves_the_extender_with_every_other_setting_as_shipped(tmp_path: Path) -> None:
    shipped = yaml.safe_load(SHIPPED.read_text(encoding="utf-8"))
    local = components.SchedulerExtender("https://127.0.0.1:4443/scheduler", tmp_path / "ca.crt")
    written = yaml.safe_load(components.write_scheduler_config(tmp_path, local).read_text(encoding="utf-8"))
    (ours,) = written["extenders"]
    assert ours["urlPrefix"] == "https://127.0.0.1:4443/scheduler"
    assert ours["tlsConfig"] == {"caFile": str(tmp_path / "ca.crt")}
    moved = ("urlPrefix", "tlsConfig")
    assert {k: v for k, v in ours.items() if k not in moved} == {
        k: v for k, v in shipped["extenders"][0].items() if k not in moved}
    assert _without_local_changes(written) == _without_local_changes(shipped)


def test_scheduler_command_line_uses_the_config_file(tmp_path: Path) -> None:
    argv = components.scheduler_argv(Binaries(tmp_path), tmp_path, {"scheduler": 12345})
    assert f"--config={components.scheduler_config_path(tmp_path)}" in argv
    # kube-scheduler ignores --kubeconfig once --config is given; leader election lives in the file.
    assert not [a for a in argv if a.startswith(("--kubeconfig", "--leader-elect"))]
