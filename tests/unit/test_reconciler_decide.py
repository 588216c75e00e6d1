"""Table tests of the pure parts of the reconciler: ``decide``, ``decide_start``, idle tracking, journal I/O."""

from __future__ import annotations

import pytest

from mig.catalog import get_model
from mig.model import PlacedInstance, Placement
from node.base.journal import Journal, parse_instance
from node.base.idle_tracking import IdleTracker
from node.layouts.reshape_start import decide_start
from node.layouts.reconciler import Create, Destroy, Transition, decide

H200 = get_model("H200")


def pi(text: str) -> PlacedInstance:
    return parse_instance(text)


def journal(phase: str = "Applying") -> Journal:
    # 7g -> 3g + 3g
    return Journal(
        "GPU-x", 0, 3, previous=(pi("7g.141gb@0:8"),), target=(pi("3g.71gb@0:4"), pi("3g.71gb@4:4")),
        destroy=(pi("7g.141gb@0:8"),), create=(pi("3g.71gb@0:4"), pi("3g.71gb@4:4")),
        phase=phase, started_at=0.0, updated_at=0.0,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("phase", "observed", "busy", "expected"),
    [
        pytest.param("Applying", {"7g.141gb@0:8"}, set(), Destroy(pi("7g.141gb@0:8")), id="destroy-first"),
        pytest.param("Applying", {"7g.141gb@0:8"}, {"7g.141gb@0:8"}, Transition("RollingBack"), id="busy-rolls-back"),
        pytest.param("Applying", set(), set(), Create(pi("3g.71gb@0:4")), id="then-create"),
        pytest.param("Applying", {"3g.71gb@0:4"}, set(), Create(pi("3g.71gb@4:4")), id="resume-after-crash"),
        pytest.param("Applying", {"3g.71gb@0:4", "3g.71gb@4:4"}, set(), Transition("Advertising"), id="done"),
        pytest.param("Applying", {"1g.18gb@0:1"}, set(), Transition("Aborted"), id="stranger-aborts"),
        pytest.param("RollingBack", {"3g.71gb@0:4"}, set(), Destroy(pi("3g.71gb@0:4")), id="undo-create"),
        pytest.param("RollingBack", {"3g.71gb@0:4"}, {"3g.71gb@0:4"}, Transition("Failed"), id="undo-blocked-by-use"),
        pytest.param("RollingBack", set(), set(), Create(pi("7g.141gb@0:8")), id="restore-previous"),
        pytest.param("RollingBack", {"7g.141gb@0:8"}, set(), Transition("Advertising"), id="restored"),
    ],
)
def test_decide(phase: str, observed: set[str], busy: set[str], expected: object) -> None:
    action = decide(journal(phase), frozenset(map(pi, observed)), frozenset(map(pi, busy)))
    if isinstance(expected, Transition):
        assert isinstance(action, Transition) and action.phase == expected.phase and action.reason
    else:
        assert action == expected


def test_decide_refuses_non_nvml_phases() -> None:
    with pytest.raises(ValueError, match="only Applying and RollingBack"):
        decide(journal("Succeeded"), frozenset(), frozenset())


def test_journal_round_trips_and_rejects_garbage() -> None:
    j = journal("RollingBack").logged("destroyed 7g.141gb@0:8", 5.0)
    assert Journal.from_dict(j.to_dict()) == j
    with pytest.raises(ValueError, match="unknown phase"):
        Journal.from_dict({**j.to_dict(), "phase": "Exploding"})
    with pytest.raises(ValueError, match="missing or bad field"):
        Journal.from_dict({"phase": "Applying"})
    with pytest.raises(ValueError, match="PROFILE@START:SIZE"):
        parse_instance("3g.71gb-0-4")


@pytest.mark.parametrize(
    ("current", "busy", "recent", "desired", "kind", "reason_has"),
    [
        pytest.param(["7g.141gb@0:8"], [], [], ["7g.141gb"], "unchanged", "", id="same-multiset"),
        pytest.param(["7g.141gb@0:8"], [], [], ["3g.71gb", "3g.71gb"], "start", "", id="idle-reshape"),
        pytest.param(["7g.141gb@0:8"], [], ["7g.141gb@0:8"], ["3g.71gb", "3g.71gb"], "wait", "idle for", id="not-idle-long-enough"),
        pytest.param(["7g.141gb@0:8"], ["7g.141gb@0:8"], ["7g.141gb@0:8"], ["3g.71gb"], "wait", "in use", id="in-use"),
        pytest.param(["3g.71gb@0:4", "3g.71gb@4:4"], ["3g.71gb@4:4"], ["3g.71gb@4:4"], ["3g.71gb", "2g.35gb", "2g.35gb"],
                     "start", "", id="keeps-busy-instance"),
        pytest.param([], [], [], ["7g.141gb", "1g.18gb"], "refuse", "does not fit", id="does-not-fit"),
        pytest.param([], [], [], ["9g.1tb"], "refuse", "valid:", id="unknown-profile"),
    ],
)
def test_decide_start(current: list[str], busy: list[str], recent: list[str], desired: list[str], kind: str,
                      reason_has: str) -> None:
    busy_set = frozenset(map(pi, busy))
    decision = decide_start(H200, tuple(map(pi, current)), busy_set, busy_set | frozenset(map(pi, recent)),
                            desired, 300.0)
    assert decision.kind == kind
    assert reason_has in decision.reason
    if decision.kind == "start":
        assert decision.plan is not None
        assert not set(decision.plan.destroy) & busy_set


def test_idle_tracker_counts_from_the_last_busy_moment() -> None:
    tracker = IdleTracker()
    a, b = pi("3g.71gb@0:4"), pi("3g.71gb@4:4")
    tracker.observe("g", [a, b], busy=[a], now=0.0)
    tracker.observe("g", [a, b], busy=[], now=100.0)
    assert tracker.not_idle_long_enough("g", [a, b], now=150.0, idle_seconds=60) == {a}
    assert tracker.not_idle_long_enough("g", [a, b], now=200.0, idle_seconds=60) == set()
    tracker.observe("g", [a, b], busy=[b], now=210.0)
    assert tracker.not_idle_long_enough("g", [a, b], now=400.0, idle_seconds=60) == {b}
    # An instance never observed (e.g. right after a restart) is not idle yet.
    c = PlacedInstance("1g.18gb", Placement(0, 1))
    assert tracker.not_idle_long_enough("g", [c], now=1e9, idle_seconds=1) == {c}


def test_placement_matters_a_busy_instance_in_the_way_means_wait() -> None:
    # 3g + 2g + 2g fits on an H200 only with the 3g at slice 4: a busy 3g at 0 blocks it.
    busy = frozenset({pi("3g.71gb@0:4")})
    decision = decide_start(H200, (pi("3g.71gb@0:4"), pi("3g.71gb@4:4")), busy, busy,
                            ["3g.71gb", "2g.35gb", "2g.35gb"], 300.0)
    assert decision.kind == "wait" and "3g.71gb@0:4" in decision.reason


@pytest.mark.parametrize(
    ("current", "busy", "target", "kind", "reason_has"),
    [
        pytest.param(["3g.71gb@0:4", "3g.71gb@4:4"], [], ["3g.71gb@0:4", "3g.71gb@4:4"], "unchanged", "", id="same"),
        pytest.param(["3g.71gb@0:4"], [], ["3g.71gb@4:4"], "start", "", id="move-idle-instance"),
        pytest.param(["3g.71gb@0:4"], ["3g.71gb@0:4"], ["3g.71gb@4:4"], "wait", "in use", id="move-busy-instance"),
        pytest.param([], [], ["3g.71gb@2:4"], "refuse", "not valid", id="placement-not-offered"),
        pytest.param([], [], ["4g.71gb@0:4", "4g.71gb@4:4"], "refuse", "not valid", id="too-many"),
    ],
)
def test_decide_start_pinned(current: list[str], busy: list[str], target: list[str], kind: str, reason_has: str) -> None:
    from node.layouts.reshape_start import decide_start_pinned

    busy_set = frozenset(map(pi, busy))
    decision = decide_start_pinned(H200, tuple(map(pi, current)), busy_set, busy_set, tuple(map(pi, target)), 60.0)
    assert decision.kind == kind and reason_has in decision.reason
    if kind == "start":
        assert decision.plan is not None and frozenset(decision.plan.target) == frozenset(map(pi, target))
