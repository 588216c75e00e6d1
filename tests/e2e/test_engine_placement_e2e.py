"""Every fractional pod placed by the packing engine, end to end, gpupack down included.

The whole stack of ``gpupack demo`` (its own real control plane, the webhook
registered over TLS and called by the API server, node agents on simulated NVML
emulating the device plugin, the controller), on two hand-made nodes whose rules
give known outcomes:

- ``whole-a``: 2 x A100 80GB, MIG off, not shared (hands out ``nvidia.com/gpu``);
- ``mps-a``: 2 x A100 80GB shared by MPS into 4 replicas.

With the webhook's default ``placement: engine`` every gpupack pod waits at the
gate until the controller pins it. With the controller stopped nothing is placed
and nothing is lost; once it runs, a 600-milli pod gets a plain whole GPU on the
whole node, a 200-milli pod a replica, a 300-milli pod never a replica of the
``r = 4`` node (it waits until that node is idle and switches to ``r = 3``), and
when a whole-GPU pod finds no free whole GPU an idle shared node returns to
whole-GPU use.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupack.demo.stack import DEMO_NAMESPACE, DemoNode, Stack
from mig.catalog import get_model
from node.nvml.simulated import SimulatedNvml
from tests.e2e.waiting import wait_for
from gpupack.testing.admission_reviews import gpu_container, make_pod

GROUP, VERSION = "gpupack.io", "v1alpha1"
NODES = (DemoNode("whole-a", "A100-80GB", 2), DemoNode("mps-a", "A100-80GB", 2, sharing="mps", replicas=4))


@pytest.fixture
def stack(control_plane: Any, tmp_path: Path) -> Iterator[Stack]:
    # The whole-GPU node's simulated GPUs run with MIG off, as a node set up for
    # whole GPUs would (changing MIG mode needs a GPU reset).
    SimulatedNvml(get_model("A100-80GB"), 2, tmp_path / "whole-a.nvml.json", seed="whole-a", mig_enabled=False)
    running = Stack(tmp_path, nodes=NODES)
    try:
        running.start(lambda _: None)
        yield running
    finally:
        logs = tmp_path / "logs"
        for name in ("controller", "controller-2", "webhook"):
            path = logs / f"{name}.log"
            if path.exists():
                print(f"--- {name} ---\n{path.read_text(errors='replace')[-2000:]}")
        running.stop()


def _pod(core: Any, name: str, milli: int) -> None:
    core.create_namespaced_pod(DEMO_NAMESPACE, make_pod(gpu_container("main", str(milli)), name=name,
                                                        namespace=DEMO_NAMESPACE, mode="mps"))


def _node_of(core: Any, name: str) -> str | None:
    return core.read_namespaced_pod(name, DEMO_NAMESPACE).spec.node_name  # type: ignore[no-any-return]


def _sharing(custom: Any, node: str) -> tuple[str, int]:
    sharing = (custom.get_cluster_custom_object(GROUP, VERSION, "gpunodes", node).get("status") or {}).get("sharing") or {}
    return str(sharing.get("mode", "none")), int(sharing.get("replicas", 1))


def test_engine_places_every_fractional_pod_and_gpupack_down_loses_none(stack: Stack) -> None:
    core = client.CoreV1Api(stack.admin)
    custom = client.CustomObjectsApi(stack.admin)
    wait_for("mps-a to share by MPS x4", lambda: _sharing(custom, "mps-a") == ("mps", 4))

    # gpupack's controller is down: pods are admitted, gated, and wait; none is bound.
    stack.stop_process("controller")
    _pod(core, "small", 200)
    _pod(core, "third", 300)
    _pod(core, "big", 600)
    big = core.read_namespaced_pod("big", DEMO_NAMESPACE)
    assert big.spec.containers[0].resources.limits == {"nvidia.com/gpu": "1"}  # a whole GPU, not one replica
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        for name in ("small", "third", "big"):
            pod = core.read_namespaced_pod(name, DEMO_NAMESPACE)
            assert pod.spec.node_name is None and [g.name for g in pod.spec.scheduling_gates] == ["gpupack.io/capacity"]
        time.sleep(0.5)

    # gpupack is back: the engine places each pod where the rules say.
    stack.start_controller("controller-2")
    assert wait_for("small bound", lambda: _node_of(core, "small"), timeout_s=60) == "mps-a"
    assert wait_for("big bound", lambda: _node_of(core, "big"), timeout_s=60) == "whole-a"
    time.sleep(3)
    assert _node_of(core, "third") is None  # 4 x 300 > 1000: never a replica of the r = 4 node

    # mps-a idle again: it switches to r = 3, and the 300-milli pod lands there.
    core.delete_namespaced_pod("small", DEMO_NAMESPACE, grace_period_seconds=0)
    assert wait_for("third bound", lambda: _node_of(core, "third"), timeout_s=90) == "mps-a"
    assert _sharing(custom, "mps-a") == ("mps", 3)

    # Whole-GPU demand beyond the whole node: the idle shared node returns to whole GPUs.
    core.delete_namespaced_pod("third", DEMO_NAMESPACE, grace_period_seconds=0)
    for name in ("big-2", "big-3"):
        _pod(core, name, 700)
    placed = {wait_for(f"{name} bound", lambda name=name: _node_of(core, name), timeout_s=90) for name in ("big-2", "big-3")}
    assert placed == {"whole-a", "mps-a"}
    assert _sharing(custom, "mps-a") == ("none", 1)
