"""The controller's planning loop backs off while cycles fail and says so once, not once per attempt."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import pytest

from controller.reconcile import CycleReport
from controller.metrics import ControllerMetrics
from controller.operator import Loop
from controller.settings import ControllerSettings
from kube.backoff import Backoff
from kube.errors import KubeError


@dataclass
class LeaseSettingsStub:
    duration_seconds: float = 1.0


class AlwaysLeader:
    settings = LeaseSettingsStub()

    def step(self) -> bool:
        return True

    def is_leader(self) -> bool:
        return True

    def release(self) -> None:
        pass


class FailingController:
    """Cycles fail ``failures`` times (the API server is down), then succeed."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.attempts = 0
        self.metrics = ControllerMetrics()
        self.done = threading.Event()

    def cycle(self) -> Any:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise KubeError(0, "API server unreachable: connection refused")
        self.done.set()
        return CycleReport()


def test_failed_cycles_back_off_and_log_once(caplog: pytest.LogCaptureFixture) -> None:
    controller = FailingController(failures=5)
    loop = Loop(controller, AlwaysLeader(), ControllerSettings(batch_seconds=0, resync_seconds=0.01))  # type: ignore[arg-type]
    loop.backoff = Backoff(base_s=0.01, max_s=0.04)
    with caplog.at_level(logging.INFO, logger="gpupack.controller"):
        loop.thread.start()
        assert controller.done.wait(30), "the loop never recovered"
        loop.stop()
        loop.thread.join(10)
    assert controller.attempts == 6
    failures = [r for r in caplog.records if "planning cycle failed" in r.getMessage()]
    assert len(failures) == 1  # five failed attempts, one log line (with its traceback)
    assert any("planning cycles work again" in r.getMessage() for r in caplog.records)
    assert controller.metrics.registry.get_sample_value(
        "gpupack_controller_reconcile_errors_total", {"stage": "cycle"}) == 5


def test_kopf_watches_only_sharing_policies_and_their_events_wake_the_loop() -> None:
    """kopf hosts the controller; pods and GPUNodes are watched by the caches alone (one watch each)."""
    from controller.operator import build_registry

    class Waker:
        woken = 0

        def wake(self) -> None:
            self.woken += 1

    waker = Waker()
    registry = build_registry(waker)  # type: ignore[arg-type]
    handlers = registry._watching.get_all_handlers()  # noqa: SLF001 - what kopf will watch
    watched = {(h.selector.group, h.selector.any_name) for h in handlers}
    assert watched == {("gpupack.io", "sharingpolicies")}
    for handler in handlers:
        handler.fn()
    assert waker.woken == len(handlers) == 1
