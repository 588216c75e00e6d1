"""One reading of a GPUNode (sharing.api.gpunode) for the webhook's inventory and the controller's
snapshot: the same object, odd entries included, gives the same GPUs, instances and sharing."""

from __future__ import annotations

from typing import Any

import pytest

from controller.state.build import node_from_objects
from sharing.api.gpunode import read_gpunode
from sharing.admission.inventory import node_from_object

H100 = "NVIDIA-H100-80GB-HBM3"


def gpunode(gpus: list[Any], sharing: dict[str, Any] | None = None, spec_sharing: dict[str, Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"product": H100, "gpus": gpus}
    if sharing is not None:
        status["sharing"] = sharing
    return {"kind": "GPUNode", "metadata": {"name": "n1", "generation": 2},
            "spec": {"sharing": spec_sharing or {"mode": "none", "replicas": 1}}, "status": status}


GOOD = {"index": 1, "uuid": "GPU-1", "product": H100, "memoryMiB": 81559, "migEnabled": True, "instances": [
    {"profile": "1g.10gb", "start": 0, "size": 1, "inUse": True},
    {"profile": "3g.40gb", "start": 4, "size": 4, "pods": ["team/a"]},  # pods listed: in use too
    {"profile": "2g.20gb", "start": 2, "size": 2}]}
ODD = [
    "not an object",
    {"uuid": "GPU-x", "memoryMiB": 81559},  # no index: its list position is no index
    {"index": "0", "memoryMiB": 81559},  # a string is no index either
    {"index": 0, "migEnabled": False},  # no memory: the catalog's
    {"index": 2, "migEnabled": True, "instances": [{"start": 0}, {"profile": "1g.10gb", "start": "0"}]},
]


def test_the_reader_keeps_what_reads_and_says_what_it_leaves_out() -> None:
    reading = read_gpunode(gpunode([GOOD, *ODD]))
    assert reading is not None
    assert [g.index for g in reading.gpus] == [0, 1, 2]
    assert reading.gpus[0].memory_mib == 81559  # H100 80GB from the catalog
    assert [(i.profile, i.in_use) for i in reading.gpus[1].instances] == [("1g.10gb", True), ("2g.20gb", False), ("3g.40gb", True)]
    assert [i.pods for i in reading.gpus[1].instances] == [(), (), ("team/a",)]  # who holds it (MIG preemption)
    assert reading.gpus[2].instances == ()
    assert len(reading.skipped) == 5 and "status.gpus[1] is not an object" in reading.skipped[0]
    assert "status.gpus[2] has no index" in reading.skipped[1]
    assert read_gpunode({"metadata": {}}) is None


@pytest.mark.parametrize(
    ("status_sharing", "spec_sharing", "mode", "replicas"),
    [
        (None, {"mode": "mps", "replicas": 4}, "mps", 4),  # the agent has not reported: the spec's
        ({"mode": "time-slicing", "replicas": 2, "inUse": 1}, {"mode": "mps", "replicas": 4}, "time-slicing", 2),
        ({"mode": "bogus"}, None, "none", 1),
    ],
)
def test_webhook_and_controller_read_one_node_alike(
    status_sharing: dict[str, Any] | None, spec_sharing: dict[str, Any] | None, mode: str, replicas: int
) -> None:
    obj = gpunode([GOOD, *ODD], status_sharing, spec_sharing)
    webhook, controller = node_from_object(obj), node_from_objects(obj, None)
    assert webhook is not None and controller is not None
    assert [g.index for g in webhook.gpus] == [g.index for g in controller.gpus] == [0, 1, 2]
    assert [g.memory_mib for g in webhook.gpus] == [g.memory_mib for g in controller.gpus]
    assert [g.mig_enabled for g in webhook.gpus] == [g.mig_enabled for g in controller.gpus]
    for w, c in zip(webhook.gpus, controller.gpus):
        assert sorted((i.profile, i.start) for i in w.instances) == sorted((i.profile, i.placement.start) for i in c.instances)
        assert sorted((i.profile, i.start) for i in w.instances if i.in_use) == sorted(
            (i.profile, i.placement.start) for i in c.in_use)
    assert webhook.sharing == controller.sharing == mode
    assert controller.replicas == replicas and webhook.replicas == (replicas if mode != "none" else 0)


def test_what_is_left_out_is_logged_once_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    from controller.reconcile import Controller
    from controller.settings import ControllerSettings
    from controller.state.build import build_snapshot
    from sharing.admission.inventory import build_inventory

    obj = gpunode([GOOD, *ODD])
    reading = read_gpunode(obj)
    assert reading is not None
    assert build_inventory([obj]).skipped_entries == reading.skipped  # the webhook's view says the same
    assert build_snapshot([obj], [], [], []).skipped_entries == reading.skipped  # and the controller's
    controller = Controller(None, ControllerSettings())  # type: ignore[arg-type]  # only the bookkeeping is used
    with caplog.at_level("WARNING", logger="gpupack.controller"):
        controller._note_skipped(reading.skipped)
        controller._note_skipped(reading.skipped)
    assert [r.getMessage() for r in caplog.records] == [f"GPUNode {s}" for s in sorted(reading.skipped)]
    assert controller.metrics.skipped_entries._value.get() == 5  # type: ignore[attr-defined]
    controller._note_skipped(build_snapshot([gpunode([GOOD])], [], [], []).skipped_entries)
    assert controller.metrics.skipped_entries._value.get() == 0  # type: ignore[attr-defined]
