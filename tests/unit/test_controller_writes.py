"""controller.reconcile: a cycle's independent writes (releases, idle records, layouts, sharing
switches, waiting pods' conditions) go ``write_workers`` at a time, each outcome to its own item."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from controller.kube import Kube
from controller.reconcile import Controller
from controller.settings import ControllerSettings


def controller(workers: int) -> Controller:
    return Controller(Kube(api=None), ControllerSettings(write_workers=workers))


def test_independent_writes_are_in_flight_together_and_answer_in_order() -> None:
    together = threading.Barrier(4, timeout=30)  # passes only if four writes wait at once

    def write(item: int) -> str:
        together.wait()
        return f"done {item}"

    assert controller(4)._each(write, [1, 2, 3, 4]) == ["done 1", "done 2", "done 3", "done 4"]


def test_one_worker_writes_one_at_a_time() -> None:
    in_flight: list[int] = []
    most = 0
    lock = threading.Lock()

    def write(item: int) -> int:
        nonlocal most
        with lock:
            in_flight.append(item)
            most = max(most, len(in_flight))
        with lock:
            in_flight.remove(item)
        return item * 2

    assert controller(1)._each(write, list(range(6))) == [0, 2, 4, 6, 8, 10]
    assert most == 1


def test_a_waiting_pods_condition_failing_is_reported_for_that_pod_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from controller.kube import KubeError
    from controller.writes.wait_status import StatusPatch

    patches = [StatusPatch("ns", f"p{i}", {"status": {}}) for i in range(3)]
    monkeypatch.setattr("controller.reconcile.placement_patches", lambda *_: patches)

    def patch_pod_status(self: Kube, namespace: str, name: str, body: dict[str, Any]) -> None:
        if name == "p1":
            raise KubeError(409, "conflict")
        if name == "p2":
            raise KubeError(404, "gone")  # deleted meanwhile: nothing to say

    monkeypatch.setattr(Kube, "patch_pod_status", patch_pod_status)
    from controller.reconcile import CycleReport
    report = CycleReport()
    c = controller(3)
    c._placement_status(report.plan, None, {}, None, report)  # type: ignore[arg-type]
    assert len(report.errors) == 1 and "ns/p1" in report.errors[0] and "conflict" in report.errors[0]

