"""Lease leader election against an in-memory Lease store with compare-and-swap, and an injected clock."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest

from kube.errors import KubeError
from controller.leader import LeaderElector, LeaseSettings


class FakeLeases:
    def __init__(self) -> None:
        self.obj: dict[str, Any] | None = None
        self.version = 0
        self.fail = False

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.fail:
            raise KubeError(503, "unavailable")
        return copy.deepcopy(self.obj)

    def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        if self.obj is not None:
            raise KubeError(409, "exists")
        return self._store(body)

    def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        if self.fail:
            raise KubeError(503, "unavailable")
        if self.obj is None or body["metadata"].get("resourceVersion") != self.obj["metadata"]["resourceVersion"]:
            raise KubeError(409, "conflict")
        return self._store(body)

    def _store(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.obj = copy.deepcopy(dict(body))
        self.obj["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.obj)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


SETTINGS = LeaseSettings(duration_seconds=15, renew_deadline_seconds=10)


def pair() -> tuple[FakeLeases, Clock, LeaderElector, LeaderElector]:
    store, clock = FakeLeases(), Clock()
    a = LeaderElector(store, "a", SETTINGS, clock=clock, wall=clock)
    b = LeaderElector(store, "b", SETTINGS, clock=clock, wall=clock)
    return store, clock, a, b


def test_first_comer_leads_and_the_other_waits() -> None:
    store, clock, a, b = pair()
    assert a.step() and not b.step()
    for _ in range(20):  # a renews every 2 s; b never gets in
        clock.t += 2
        assert a.step()
        assert not b.step()
        assert a.is_leader() != b.is_leader()


def test_standby_takes_over_only_after_a_full_silent_duration() -> None:
    store, clock, a, b = pair()
    a.step()
    b.step()
    clock.t += 14  # a went silent (crashed)
    assert not b.step()
    clock.t += 1.5
    assert b.step() and b.is_leader()
    assert store.obj is not None and store.obj["spec"]["holderIdentity"] == "b"
    assert store.obj["spec"]["leaseTransitions"] == 1


def test_a_leader_that_cannot_renew_stops_acting_before_anyone_can_take_over() -> None:
    store, clock, a, b = pair()
    a.step()
    b.step()
    store.fail = True
    clock.t += SETTINGS.renew_deadline_seconds + 0.1
    assert not a.step() and not a.is_leader()  # quiet before the lease could expire
    store.fail = False
    clock.t += SETTINGS.duration_seconds - SETTINGS.renew_deadline_seconds
    assert b.step()


def test_release_hands_over_at_once() -> None:
    store, clock, a, b = pair()
    a.step()
    b.step()
    a.release()
    assert not a.is_leader()
    clock.t += 0.5
    assert b.step()


@pytest.mark.parametrize("steps", [50])
def test_never_two_leaders_under_interleaving(steps: int) -> None:
    import random

    rng = random.Random(5)
    store, clock, a, b = pair()
    for _ in range(steps * 10):
        clock.t += rng.choice([0.5, 1, 3, 7, 16])
        rng.choice([a, b]).step()
        store.fail = rng.random() < 0.1
        assert not (a.is_leader() and b.is_leader())
