"""What starts a controller cycle: a change in the watch caches, or the resync interval; nothing else.

And what a cycle skips: with nothing waiting and no policy pinning a layout, the planner does
not even count free capacity.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pytest

from controller.planning import planner
from controller.reconcile import CycleReport
from controller.metrics import ControllerMetrics
from controller.operator import Loop
from controller.planning.planner import Plan, Wait, plan
from controller.settings import ControllerSettings
from controller.state.snapshot import Gpu, Node, Pod, Snapshot
from mig.catalog import get_model
from sharing.rules.node_policy import NodePolicy

H100 = get_model("H100-80GB")
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


@dataclass
class LeaseSettingsStub:
    duration_seconds: float = 0.5  # a renewal (a loop turn) every 0.5 s


class Leader:
    settings = LeaseSettingsStub()

    def __init__(self) -> None:
        self.steps = 0
        self.gate = threading.Lock()
        """Held by a test to keep the loop from reaching a cycle meanwhile (it renews before each)."""

    def step(self) -> bool:
        with self.gate:
            self.steps += 1
        return True

    def is_leader(self) -> bool:
        return True

    def release(self) -> None:
        pass


class CountingController:
    def __init__(self, deferring: int = 0) -> None:
        self.cycles = 0
        self.metrics = ControllerMetrics()
        self.deferring = deferring
        """Cycles that leave a pod to the next one (a bounded layout search), the first ones."""

    def cycle(self) -> CycleReport:
        self.cycles += 1
        if self.cycles <= self.deferring:
            return CycleReport(plan=Plan(waiting=(Wait("ns/p", "searched next cycle", deferred=True),)))
        return CycleReport()


class FakeCaches:
    """What the loop uses of controller.watch_caches.ClusterCaches."""

    def __init__(self) -> None:
        self.on_change: Callable[[str], None] | None = None
        self.started: set[str] = set()
        self.informers: dict[str, Any] = {}
        self.waited = 0

    def start(self) -> None:
        self.started.add("pods")

    def wait_synced(self, timeout_s: float) -> list[str]:
        self.waited += 1
        return []


def until(condition: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def running() -> Any:
    loops: list[Loop] = []

    def start(caches: FakeCaches | None = None, deferring: int = 0) -> tuple[Loop, CountingController, Leader]:
        controller, leader = CountingController(deferring), Leader()
        settings = ControllerSettings(batch_seconds=0, resync_seconds=3600, min_cycle_seconds=0)
        loop = Loop(controller, leader, settings, caches=caches)  # type: ignore[arg-type]
        loops.append(loop)
        loop.thread.start()
        return loop, controller, leader

    yield start
    for loop in loops:
        loop.stop()
        loop.thread.join(10)


def test_no_cycle_runs_while_nothing_changes(running: Any) -> None:
    caches = FakeCaches()
    loop, controller, leader = running(caches)
    assert until(lambda: controller.cycles == 1)  # the first: nothing is known yet
    assert caches.started == {"pods"} and caches.waited == 1  # started on leading, listed before that cycle
    steps = leader.steps
    assert until(lambda: leader.steps >= steps + 3)  # three lease renewals later...
    assert controller.cycles == 1 and loop.skipped >= 3  # ... still one cycle: nothing changed, no resync due
    assert caches.on_change is not None
    caches.on_change("pods")  # what a cache's listener calls on a change that matters
    assert until(lambda: controller.cycles == 2)
    assert caches.waited == 1  # the caches are started and waited for once


def test_pods_left_to_the_next_cycle_run_it_without_a_change(running: Any) -> None:
    loop, controller, leader = running(FakeCaches(), deferring=2)
    assert until(lambda: controller.cycles == 3)  # the first, and one after each cycle that deferred a pod
    steps = leader.steps
    assert until(lambda: leader.steps >= steps + 3)
    assert controller.cycles == 3  # then nothing is left over: no more cycles


def test_a_burst_of_changes_is_one_cycle_per_gap(running: Any) -> None:
    caches = FakeCaches()
    loop, controller, leader = running(caches)
    assert until(lambda: controller.cycles == 1)
    assert caches.on_change is not None
    with leader.gate:
        for _ in range(50):
            caches.on_change("pods")  # all before the loop can reach a cycle (it renews the lease first)
    assert until(lambda: controller.cycles >= 2)
    steps_then = loop.skipped
    assert until(lambda: loop.skipped > steps_then)  # the loop turned again without another change...
    assert controller.cycles == 2  # ... and ran no cycle for the 49 changes the first one already covered


def test_resync_runs_a_cycle_without_a_change(running: Any) -> None:
    controller, leader = CountingController(), Leader()
    settings = ControllerSettings(batch_seconds=0, resync_seconds=0.01, min_cycle_seconds=0)
    loop = Loop(controller, leader, settings)  # type: ignore[arg-type]
    loop.thread.start()
    try:
        assert until(lambda: controller.cycles >= 3)
    finally:
        loop.stop()
        loop.thread.join(10)
    assert controller.metrics.registry.get_sample_value(
        "gpupack_controller_cycle_triggers_total", {"trigger": "resync"}) >= 3


def test_nothing_waiting_plans_nothing_and_counts_no_capacity(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = tuple(Gpu(i, H100.memory_mib, True) for i in range(2))
    nodes = (Node("a", H100.product, H100, (), "none", 1, gpus),)
    bound = Pod("team", "p", "mig", NOW, profiles=("1g.10gb",), milli=(100,), memory_bytes=(None,), node="a", bound=True)
    snapshot = Snapshot(nodes, (bound,), {"a": NodePolicy(names=("p",))})

    def never(*_: Any) -> Any:
        raise AssertionError("free capacity counted with nothing waiting")

    monkeypatch.setattr(planner.FreeCapacity, "of", never)
    assert plan(snapshot, NOW) == Plan()
    waiting = Pod("team", "w", "mig", NOW, profiles=("1g.10gb",), milli=(100,), memory_bytes=(None,), gated=True)
    with pytest.raises(AssertionError, match="free capacity counted"):
        plan(Snapshot(nodes, (bound, waiting), snapshot.policies), NOW)
