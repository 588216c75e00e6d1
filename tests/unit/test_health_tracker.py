"""The fault tracker (node.health.tracker) on a real SimulatedNvml: signals in, faults out.

Every test reads the simulated GPUs the way the agent does (``read_snapshot`` with the
GPUs last seen, then ``read_signals``) and feeds ``HealthTracker.observe``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mig.catalog import get_model
from node.health.ack import Acknowledgements, acknowledge, read_acknowledgements
from node.health.signals import read_signals
from node.health.tracker import DeviceKey, HealthReport, HealthTracker, Signals
from node.health.xids import BUILTIN, XidRule, merged
from node.nvml.errors import NvmlError
from node.nvml.simulated import SimulatedNvml
from node.base.snapshot import GpuSnapshot, NodeSnapshot, read_snapshot, status_from_snapshot
from sharing.api.crd import GPUNodeStatus
from sharing.api.keys import HEALTH_ACK_ANNOTATION

H200 = get_model("H200")
THREE_G = H200.profile("3g.71gb")
ONE_G = H200.profile("1g.18gb")
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
APPLICATION_XIDS = (13, 31, 43, 45, 68, 109)


@dataclass
class Rig:
    """A simulated node and a tracker, observed as the agent observes them."""

    sim: SimulatedNvml
    tracker: HealthTracker = field(default_factory=HealthTracker)
    known: dict[int, GpuSnapshot] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    now: datetime = T0
    shared: bool = False
    last_snapshot: NodeSnapshot | None = None
    last_signals: Signals | None = None

    def snapshot(self) -> NodeSnapshot:
        snap = read_snapshot(self.sim, self.sim.kind, None, self.known)
        self.known.update({g.info.index: g for g in snap.gpus if not g.lost and g.error is None})
        return snap

    def observe(self, pods_by_device: Mapping[str, Sequence[str]] | None = None, *,
                minutes: float = 1.0) -> HealthReport:
        self.now += timedelta(minutes=minutes)
        snap = self.snapshot()
        signals, _warnings = read_signals(self.sim, snap)
        self.last_snapshot, self.last_signals = snap, signals
        return self.tracker.observe(signals, snap, pods_by_device or {}, self.acks(), self.now, shared=self.shared)

    def acks(self) -> Acknowledgements:
        return read_acknowledgements(self.annotations)

    def acknowledge(self, index: int, when: datetime) -> None:
        self.annotations[HEALTH_ACK_ANNOTATION] = acknowledge(self.annotations, [index], when)


def _mig_sim(count: int = 2) -> SimulatedNvml:
    """``count`` H200s in MIG mode, each cut into two 3g.71gb instances (gi ids 1 and 2)."""
    sim = SimulatedNvml(H200, count, mig_enabled=True)
    for index in range(count):
        for placement in THREE_G.placements[:2]:
            sim.create_gpu_instance(index, THREE_G.profile_id, placement)
    return sim


def _sim(mig: bool, count: int = 2) -> SimulatedNvml:
    return _mig_sim(count) if mig else SimulatedNvml(H200, count, mig_enabled=False)


# ------------------------------------------------------------------- lost GPU
@pytest.mark.parametrize("mig", [True, False], ids=["mig", "full"])
def test_a_lost_gpu_is_faulted_withdrawn_and_needs_a_reboot(mig: bool) -> None:
    rig = Rig(_sim(mig))
    assert rig.observe().faults == {}
    rig.sim.lose_gpu(1)
    report = rig.observe()
    fault = report.gpu(1)
    assert fault is not None
    assert fault.reason in ("Xid79", "GpuLost")
    assert fault.withdrawn is True and fault.recovery == "RebootNode"
    assert [k for k, _f in report.began] == [(1, None)]
    assert report.gpu(0) is None and (0, None) not in report.faults
    assert all(k[0] == 1 for k in report.faults)  # nothing on GPU 0
    since = fault.since
    # Time passing changes nothing, however long.
    for _ in range(50):
        report = rig.observe(minutes=60)
        assert report.gpu(1) is not None and report.gpu(1).since == since  # type: ignore[union-attr]
        assert report.began == () and report.ended == ()
    # A repair (the GPU answers again) is no reboot: the fault stays.
    rig.sim.repair(1)
    report = rig.observe()
    assert report.gpu(1) is not None and report.gpu(1).since == since  # type: ignore[union-attr]
    assert report.ended == ()
    # A reset is refused on a lost GPU; once it answers, a reset is not what XID 79 asks for either.
    rig.sim.reset_gpu(1)
    report = rig.observe()
    assert report.gpu(1) is not None and report.ended == ()
    rig.sim.reboot()
    report = rig.observe()
    assert report.faults == {}
    assert [(e.key, e.why) for e in report.ended] == [((1, None), "the node rebooted")]


def test_a_gpu_lost_and_still_lost_is_cleared_by_a_reboot_only() -> None:
    rig = Rig(_sim(False))
    rig.observe()
    rig.sim.lose_gpu(0)
    report = rig.observe()
    assert report.gpu(0) is not None and report.gpu(0).withdrawn  # type: ignore[union-attr]
    assert rig.last_signals is not None and rig.last_signals.lost == frozenset({0})
    with pytest.raises(NvmlError):
        rig.sim.reset_gpu(0)
    assert rig.observe().gpu(0) is not None
    rig.sim.reboot()
    assert rig.observe().faults == {}


# -------------------------------------------------------------- XIDs and MIG
def test_an_xid_on_a_mig_instance_faults_that_instance_only() -> None:
    rig = Rig(_mig_sim())
    rig.observe()
    rig.sim.inject_xid(0, 94, gi_id=2)
    report = rig.observe()
    assert set(report.faults) == {(0, 2)}
    fault = report.instance(0, 2)
    assert fault is not None
    assert fault.reason == "Xid94" and fault.xid == 94 and fault.recovery == "ResetGpu"
    assert fault.withdrawn is True
    assert "MIG instance 2 of GPU 0" in fault.message
    assert report.instance(0, 1) is None and report.gpu(0) is None
    assert report.gpu(1) is None and report.instance(1, 2) is None
    assert not report.degraded
    assert not report.all_gpus_unhealthy(2)


@pytest.mark.parametrize(
    ("mig", "shared", "withdrawn"),
    [(False, True, False), (False, False, True), (True, False, True), (True, True, True)],
    ids=["full-shared-degraded", "full-unshared-withdrawn", "mig-withdrawn", "mig-shared-withdrawn"],
)
def test_a_gpu_level_xid_is_withdrawn_unless_the_full_gpu_is_shared(mig: bool, shared: bool, withdrawn: bool) -> None:
    rig = Rig(_sim(mig), shared=shared)
    rig.observe()
    rig.sim.inject_xid(1, 48)
    report = rig.observe()
    fault = report.gpu(1)
    assert fault is not None and fault.reason == "Xid48" and fault.xid == 48
    assert fault.withdrawn is withdrawn
    assert report.degraded is (not withdrawn)
    assert set(report.faults) == {(1, None)}


def test_an_xid_naming_an_instance_that_no_longer_exists_faults_the_gpu() -> None:
    rig = Rig(_mig_sim(1))
    rig.observe()
    rig.sim.inject_xid(0, 94, gi_id=1)
    rig.sim.destroy_gpu_instance(0, 1)
    report = rig.observe()
    assert set(report.faults) == {(0, None)}


@pytest.mark.parametrize("xid", APPLICATION_XIDS)
def test_application_xids_raise_no_fault(xid: int) -> None:
    rig = Rig(_mig_sim())
    rig.observe()
    rig.sim.inject_xid(0, xid, gi_id=1)
    rig.sim.inject_xid(1, xid)
    report = rig.observe()
    assert report.faults == {} and report.began == ()
    assert [(e.gpu_index, e.xid, e.gi_id) for e in report.application_xids] == [(0, xid, 1), (1, xid, None)]
    assert report.unknown_xids == ()


def test_an_unknown_xid_faults_as_unknown() -> None:
    rig = Rig(_sim(False))
    rig.observe()
    rig.sim.inject_xid(0, 9999)
    report = rig.observe()
    fault = report.gpu(0)
    assert fault is not None and fault.reason == "UnknownXid" and fault.xid == 9999
    assert fault.recovery == "ResetGpu" and fault.withdrawn
    assert "treated as fatal" in fault.message
    assert [e.xid for e in report.unknown_xids] == [9999]
    assert report.application_xids == ()


def test_the_table_in_force_decides() -> None:
    table = merged({13: XidRule(13, "unhealthy", "RebootNode", "not ours"), 48: XidRule(48, "application", "ResetGpu", "x")})
    rig = Rig(_sim(False), tracker=HealthTracker(table))
    rig.observe()
    rig.sim.inject_xid(0, 13)
    rig.sim.inject_xid(1, 48)
    report = rig.observe()
    assert set(report.faults) == {(0, None)}
    assert report.gpu(0).reason == "Xid13" and report.gpu(0).recovery == "RebootNode"  # type: ignore[union-attr]
    assert [e.xid for e in report.application_xids] == [48]


def test_an_xid_fault_ends_on_a_gpu_reset_and_not_before() -> None:
    rig = Rig(_sim(False))
    rig.observe()
    rig.sim.inject_xid(0, 119)
    assert rig.observe().gpu(0) is not None
    for _ in range(10):
        assert rig.observe(minutes=600).gpu(0) is not None
    rig.sim.reset_gpu(0)
    report = rig.observe()
    assert report.faults == {}
    assert [(e.key, e.why) for e in report.ended] == [((0, None), "the GPU was reset")]


def test_a_stronger_recovery_is_kept_with_the_first_since() -> None:
    rig = Rig(_sim(False))
    rig.observe()
    rig.sim.inject_xid(0, 48)
    first = rig.observe().gpu(0)
    assert first is not None and first.recovery == "ResetGpu"
    rig.sim.lose_gpu(0)
    report = rig.observe()
    fault = report.gpu(0)
    assert fault is not None and fault.recovery == "RebootNode" and fault.since == first.since
    assert report.began == ()  # the same fault, asking for more
    rig.sim.repair(0)
    rig.sim.reset_gpu(0)  # a reset no longer ends it
    assert rig.observe().gpu(0) is not None


# ----------------------------------------------------------------------- ECC
@pytest.mark.parametrize("mig", [True, False], ids=["mig", "full"])
def test_an_ecc_burst_degrades_the_gpu_until_a_reset(mig: bool) -> None:
    rig = Rig(_sim(mig))
    rig.observe()  # the baseline
    rig.sim.inject_ecc(0, 3)
    report = rig.observe()
    fault = report.gpu(0)
    assert fault is not None
    assert fault.reason == "EccUncorrectable"
    assert "3 new uncorrected ECC error(s)" in fault.message
    assert fault.withdrawn is False and fault.recovery == "ResetGpu" and fault.xid is None
    assert report.degraded
    assert set(report.faults) == {(0, None)}
    for _ in range(5):
        assert rig.observe(minutes=120).gpu(0) is not None
    rig.sim.reset_gpu(0)
    report = rig.observe()
    assert report.faults == {}
    assert [e.why for e in report.ended] == ["the GPU was reset"]
    assert not report.degraded
    # Counters restart from zero after the reset: no new fault from the lifetime counter either.
    assert rig.observe().faults == {}


def test_ecc_errors_cleared_by_a_reset_before_anyone_looked_raise_nothing() -> None:
    rig = Rig(_sim(False))
    rig.observe()
    rig.sim.inject_ecc(1, 1, retire=True)
    rig.sim.reset_gpu(1)  # the volatile counter is back to 0, the retirement took effect
    assert rig.observe().faults == {}


def test_an_ecc_burst_with_pages_to_retire_is_one_fault_of_the_gpu() -> None:
    rig = Rig(_sim(False))
    rig.observe()
    rig.sim.inject_ecc(0, 2, retire=True)
    report = rig.observe()
    assert set(report.faults) == {(0, None)} and len(report.began) == 1
    assert report.gpu(0).reason == "EccUncorrectable"  # type: ignore[union-attr]


def test_ecc_counts_present_at_the_first_observation_are_a_baseline() -> None:
    sim = _sim(False)
    sim.inject_ecc(0, 5, retire=False)  # history from before the agent started
    sim.inject_ecc(1, 5, retire=True)  # ... and a retirement still pending
    rig = Rig(sim)
    report = rig.observe()
    assert report.gpu(0) is None
    fault = report.gpu(1)
    assert fault is not None and fault.reason == "RetiredPagesPending"
    assert fault.recovery == "ResetGpu" and fault.withdrawn is False
    # New errors after the baseline do count.
    sim.inject_ecc(0, 1, retire=False)
    report = rig.observe()
    assert report.gpu(0) is not None and report.gpu(0).reason == "EccUncorrectable"  # type: ignore[union-attr]
    assert "1 new uncorrected" in report.gpu(0).message  # type: ignore[union-attr]


def test_row_remap_pending_needs_a_reset() -> None:
    rig = Rig(_sim(False))
    rig.observe()
    rig.sim.inject_row_remap(0)
    fault = rig.observe().gpu(0)
    assert fault is not None and fault.reason == "RowRemapPending" and fault.recovery == "ResetGpu"
    rig.sim.reset_gpu(0)
    assert rig.observe().faults == {}


# --------------------------------------------------------- failed row remap
def test_a_failed_row_remap_ends_only_with_an_acknowledgement() -> None:
    rig = Rig(_sim(False))
    rig.observe()
    rig.sim.inject_row_remap(0, failed=True)
    report = rig.observe()
    fault = report.gpu(0)
    assert fault is not None and fault.reason == "RowRemapFailure" and fault.recovery == "Acknowledge"
    assert fault.withdrawn is False
    since = fault.since
    rig.sim.reset_gpu(0)
    assert rig.observe().gpu(0) is not None
    rig.sim.reboot()
    report = rig.observe()
    assert report.gpu(0) is not None and report.gpu(0).since == since  # type: ignore[union-attr]
    assert report.ended == ()
    # An acknowledgement from before the fault began hides nothing.
    rig.acknowledge(0, since - timedelta(seconds=1))
    assert rig.observe().gpu(0) is not None
    # An acknowledgement of another GPU neither.
    rig.acknowledge(1, rig.now)
    assert rig.observe().gpu(0) is not None
    rig.acknowledge(0, rig.now)
    report = rig.observe()
    assert report.faults == {}
    assert [(e.key, e.why) for e in report.ended] == [((0, None), "acknowledged by an admin")]
    # The same, unchanged signal does not raise it again.
    for _ in range(5):
        report = rig.observe()
        assert report.faults == {} and report.began == ()


def test_an_acknowledgement_at_exactly_since_ends_the_fault() -> None:
    rig = Rig(_sim(False))
    rig.observe()
    rig.sim.inject_row_remap(0, failed=True)
    since = rig.observe().gpu(0).since  # type: ignore[union-attr]
    rig.acknowledge(0, since)
    assert rig.observe().faults == {}


def test_an_acknowledgement_written_for_a_sub_second_since_covers_it() -> None:
    """``acknowledge(..., when)`` must cover a fault that began at ``when``, fractions of a second included."""
    since = datetime(2026, 12, 1, 12, 0, 0, 500_000, tzinfo=timezone.utc)
    value = acknowledge(None, [0], since)
    # Times are written to the second; covers() compares at that resolution.
    assert read_acknowledgements({HEALTH_ACK_ANNOTATION: value}).covers(0, since)


def test_an_acknowledged_failed_remap_is_not_raised_again_by_a_restarted_tracker() -> None:
    rig = Rig(_sim(False))
    rig.observe()
    rig.sim.inject_row_remap(0, failed=True)
    rig.observe()
    rig.acknowledge(0, rig.now)
    report = rig.observe()
    assert report.faults == {}
    assert rig.last_snapshot is not None
    status = status_from_snapshot(rig.last_snapshot, {}, observed_generation=1, sharing=None, conditions=[],
                                  reconfiguration=None, health={}, degraded=False,
                                  memory_signals=rig.tracker.memory_seen)
    # The agent restarts: a new tracker, restored from the status the old one wrote (no faults, and the
    # memory signals as last seen).
    restarted = HealthTracker()
    assert restarted.restore(status) == []
    rig.tracker = restarted
    report = rig.observe()
    # The acknowledged, unchanged signal is not raised again (the restored tracker knows it was up).
    assert report.faults == {}


def test_a_remap_that_failed_while_the_agent_was_down_is_raised_despite_an_older_acknowledgement() -> None:
    rig = Rig(_sim(False))
    rig.observe()
    rig.sim.inject_xid(0, 48)  # an earlier, unrelated fault, acknowledged
    rig.observe()
    rig.acknowledge(0, rig.now)
    assert rig.observe().faults == {}
    assert rig.last_snapshot is not None
    status = status_from_snapshot(rig.last_snapshot, {}, observed_generation=1, sharing=None, conditions=[],
                                  reconfiguration=None, health={}, degraded=False)
    # The agent is down (an upgrade); meanwhile a row remapping fails. The new agent starts.
    rig.sim.inject_row_remap(0, failed=True)
    rig.tracker = HealthTracker()
    rig.tracker.restore(status)
    report = rig.observe()
    fault = report.gpu(0)
    # A signal that came up while no agent ran is new, whatever older acknowledgements say.
    assert fault is not None and fault.reason == "RowRemapFailure"


# ----------------------------------------------------------------------- pods
def test_the_pods_using_the_device_are_recorded_on_the_fault() -> None:
    rig = Rig(_mig_sim())
    rig.observe()
    snap = rig.snapshot()
    gpu0 = snap.gpu(0)
    gpu1 = snap.gpu(1)
    assert gpu0 is not None and gpu1 is not None
    by_uuid = {i.gi_id: i.uuid for i in gpu0.instances}
    pods = {by_uuid[1]: ["ml/a"], by_uuid[2]: ["ml/c", "ml/b"], gpu1.instances[0].uuid: ["other/x"]}
    rig.sim.inject_xid(0, 94, gi_id=2)
    rig.sim.inject_xid(1, 48)
    report = rig.observe(pods)
    assert report.instance(0, 2).pods == ("ml/b", "ml/c")  # type: ignore[union-attr]
    assert report.gpu(1).pods == ("other/x",)  # type: ignore[union-attr]  # every device of the GPU
    fault = dict(report.began)[(0, 2)]
    assert fault.pods == ("ml/b", "ml/c")


def test_the_pods_of_a_whole_gpu_fault_include_the_gpu_itself() -> None:
    rig = Rig(_sim(False))
    rig.observe()
    snap = rig.snapshot()
    uuid0 = snap.gpu(0).info.uuid  # type: ignore[union-attr]
    rig.sim.inject_xid(0, 95)
    report = rig.observe({uuid0: ["team/train", "team/eval"]})
    assert report.gpu(0).pods == ("team/eval", "team/train")  # type: ignore[union-attr]


# -------------------------------------------------------------------- restore
def _status(rig: Rig, report: HealthReport, pods: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
    assert rig.last_snapshot is not None
    status = status_from_snapshot(rig.last_snapshot, pods or {}, observed_generation=1, sharing=None, conditions=[],
                                  reconfiguration=None, health={k: f.status() for k, f in report.faults.items()},
                                  degraded=report.degraded)
    # The round trip goes through the API model, as the agent's patch and the next agent's read do.
    return GPUNodeStatus.model_validate(status).model_dump(mode="json", by_alias=True, exclude_none=True)


def test_restore_reproduces_the_faults_from_status() -> None:
    rig = Rig(_mig_sim(3))
    rig.observe()
    snap = rig.snapshot()
    gpu0 = snap.gpu(0)
    assert gpu0 is not None
    pods = {gpu0.instances[1].uuid: ["ml/p"]}
    rig.sim.inject_xid(0, 94, gi_id=2)
    rig.sim.inject_ecc(1, 2)
    rig.sim.lose_gpu(2)
    rig.observe(pods)
    rig.sim.inject_row_remap(1, failed=True)  # a stronger recovery, asked for by the same fault
    report = rig.observe(pods)
    assert set(report.faults) == {(0, 2), (1, None), (2, None)}
    status = _status(rig, report, pods)
    assert status["summary"]["unhealthyGpus"] == 2 and status["summary"]["unhealthyInstances"] == 1
    assert status["summary"]["degraded"] is True
    restored = HealthTracker()
    assert restored.restore(status) == []
    assert restored.restored
    assert restored.faults == dict(report.faults)
    # The restored tracker goes on as the old one would: a reboot ends all but the acknowledge-only one.
    rig.tracker = restored
    rig.sim.reboot()
    report = rig.observe()
    assert set(report.faults) == {(1, None)} and report.gpu(1).recovery == "Acknowledge"  # type: ignore[union-attr]


def test_restore_keeps_an_unreadable_entry_as_a_fault() -> None:
    tracker = HealthTracker()
    status = {"gpus": [{"index": 0, "health": {"reason": "not a reason!", "message": "x"}},
                       {"index": "1", "health": {"reason": "Xid48"}},
                       {"index": 2, "instances": [{"giId": 3, "health": None}]}]}
    problems = tracker.restore(status)
    assert len(problems) == 1 and "GPU 0" in problems[0]
    assert set(tracker.faults) == {(0, None)}
    assert tracker.faults[(0, None)].reason == "Unreadable" and tracker.faults[(0, None)].recovery == "Acknowledge"


def test_restored_fault_is_not_raised_twice() -> None:
    rig = Rig(_sim(False))
    rig.observe()
    rig.sim.inject_ecc(0, 1)
    report = rig.observe()
    status = _status(rig, report)
    rig.tracker = HealthTracker()
    rig.tracker.restore(status)
    report = rig.observe()
    assert report.began == () and set(report.faults) == {(0, None)}


# ---------------------------------------------------------- vanished instance
def test_a_mig_instance_fault_ends_when_the_instance_is_gone() -> None:
    rig = Rig(_mig_sim(1))
    rig.observe()
    rig.sim.inject_xid(0, 94, gi_id=1)
    assert set(rig.observe().faults) == {(0, 1)}
    rig.sim.destroy_gpu_instance(0, 1)
    report = rig.observe()
    assert report.faults == {}
    assert [(e.key, e.why) for e in report.ended] == [((0, 1), "the MIG instance no longer exists")]
    # A new instance that takes the same slices gets a fresh id and is healthy.
    rig.sim.create_gpu_instance(0, THREE_G.profile_id, THREE_G.placements[0])
    assert rig.observe().faults == {}


def test_an_instance_fault_on_a_lost_gpu_is_not_taken_for_a_vanished_instance() -> None:
    rig = Rig(_mig_sim(1))
    rig.observe()
    rig.sim.inject_xid(0, 94, gi_id=1)
    rig.observe()
    rig.sim.lose_gpu(0)
    report = rig.observe()
    assert (0, 1) in report.faults and (0, None) in report.faults
    assert report.ended == ()


# ------------------------------------------------------- backends that say less
def test_the_lifetime_counter_counts_where_the_volatile_one_is_not_supported() -> None:
    from node.nvml.protocol import MemoryHealth

    rig = Rig(_sim(False, 1))
    snap = rig.snapshot()
    tracker = HealthTracker()

    def signals(aggregate: int) -> Signals:
        return Signals(memory={0: MemoryHealth(None, aggregate, None, None, None)}, boot_id="b", reset_markers={0: "r"})

    assert tracker.observe(signals(7), snap, {}, Acknowledgements({}), T0, shared=False).faults == {}  # history
    assert tracker.observe(signals(7), snap, {}, Acknowledgements({}), T0, shared=False).faults == {}
    report = tracker.observe(signals(9), snap, {}, Acknowledgements({}), T0, shared=False)
    assert report.gpu(0) is not None and report.gpu(0).reason == "EccUncorrectable"  # type: ignore[union-attr]
    assert "2 new" in report.gpu(0).message  # type: ignore[union-attr]


class DeafNvml(SimulatedNvml):
    """NVML's event wait fails."""

    def xid_events(self):  # type: ignore[no-untyped-def]
        raise NvmlError(999, "event set wait failed")


def test_unreadable_xid_events_fault_every_gpu() -> None:
    rig = Rig(DeafNvml(H200, 2, mig_enabled=False))
    report = rig.observe()
    assert set(report.faults) == {(0, None), (1, None)}
    assert all(f.reason == "XidEventsUnreadable" and f.withdrawn for f in report.faults.values())


# ------------------------------------------------------------ property test
_BY_KIND: dict[str, st.SearchStrategy[tuple[Any, ...]]] = {
    "xid": st.tuples(st.just("xid"), st.integers(0, 1),
                     st.sampled_from((13, 31, 43, 45, 68, 109, 48, 94, 95, 119, 9999)), st.booleans()),
    "ecc": st.tuples(st.just("ecc"), st.integers(0, 1), st.integers(1, 3), st.booleans()),
    "remap": st.tuples(st.just("remap"), st.integers(0, 1), st.booleans()),
    "lose": st.tuples(st.just("lose"), st.integers(0, 1)),
    "reset": st.tuples(st.just("reset"), st.integers(0, 1)),
    "reboot": st.tuples(st.just("reboot")),
    "ack": st.tuples(st.just("ack"), st.integers(0, 1)),
    "create": st.tuples(st.just("create"), st.integers(0, 1)),
    "destroy": st.tuples(st.just("destroy"), st.integers(0, 1)),
    "observe": st.tuples(st.just("observe")),
}
# Observations, XIDs and resets come often; losing a GPU (which only a reboot undoes) and rebooting less so.
_WEIGHTED = ["observe"] * 5 + ["xid"] * 4 + ["reset"] * 3 + ["ecc"] * 2 + ["create"] * 2 + [
    "remap", "lose", "reboot", "ack", "destroy"]
OPS = st.sampled_from(_WEIGHTED).flatmap(lambda kind: _BY_KIND[kind])


@dataclass
class Between:
    """What happened since the last observation (what may end a fault)."""

    reset: set[int] = field(default_factory=set)
    rebooted: bool = False
    acked: set[int] = field(default_factory=set)
    app_xids: int = 0


def _apply(rig: Rig, op: tuple[Any, ...], between: Between) -> None:
    sim, kind = rig.sim, op[0]
    try:
        if kind == "xid":
            _k, index, xid, on_instance = op
            gi = None
            if on_instance:
                try:
                    instances = sim.gpu_instances(index)
                except NvmlError:
                    instances = ()
                gi = instances[0].gi_id if instances else None
            sim.inject_xid(index, xid, gi)
            if xid in APPLICATION_XIDS:
                between.app_xids += 1
        elif kind == "ecc":
            sim.inject_ecc(op[1], op[2], retire=op[3])
        elif kind == "remap":
            sim.inject_row_remap(op[1], failed=op[2])
        elif kind == "lose":
            sim.lose_gpu(op[1])
        elif kind == "reset":
            sim.reset_gpu(op[1])
            between.reset.add(op[1])
        elif kind == "reboot":
            sim.reboot()
            between.rebooted = True
            between.app_xids = 0  # the reboot dropped the undelivered events
        elif kind == "ack":
            rig.acknowledge(op[1], rig.now)
            between.acked.add(op[1])
        elif kind == "create":
            taken = sim.gpu_instances(op[1])
            used = {p.start for i in taken for p in [i.placement]}
            free = [p for p in ONE_G.placements if p.start not in used and all(
                not (i.placement.start <= p.start < i.placement.start + i.placement.size) for i in taken)]
            if free:
                sim.create_gpu_instance(op[1], ONE_G.profile_id, free[0])
        elif kind == "destroy":
            taken = sim.gpu_instances(op[1])
            if taken:
                sim.destroy_gpu_instance(op[1], taken[-1].gi_id)
    except NvmlError:
        pass  # refused as NVML refuses (GPU lost, in use, MIG off): nothing happened


def _check(rig: Rig, before: Mapping[DeviceKey, Any], report: HealthReport, between: Between) -> None:
    snap, signals = rig.last_snapshot, rig.last_signals
    assert snap is not None and signals is not None
    present = {(g.info.index, i.gi_id) for g in snap.gpus for i in g.instances}
    # (a) a fault ends only on its recovery.
    for key, fault in before.items():
        if key in report.faults:
            continue
        index, gi = key
        justified = (index in between.reset or between.rebooted or index in between.acked
                     or (gi is not None and key not in present))
        assert justified, f"{key} {fault} ended without a reset, reboot, acknowledgement or vanishing"
        assert any(e.key == key for e in report.ended)
    for end in report.ended:
        assert end.key in before
    # (b) application XIDs never create faults.
    assert all(f.xid not in APPLICATION_XIDS for f in report.faults.values())
    assert all(f.xid not in APPLICATION_XIDS for _k, f in report.began)
    assert len(report.application_xids) == between.app_xids
    # (c) a lost GPU always has a fault, and it is withdrawn.
    for index in signals.lost:
        assert (index, None) in report.faults
        assert report.faults[(index, None)].withdrawn
    for gpu in snap.gpus:
        if gpu.lost:
            assert (gpu.info.index, None) in report.faults
    # Faults are about devices that exist(ed).
    for index, gi in report.faults:
        assert 0 <= index < rig.sim.device_count()
    # The report is the tracker's state.
    assert report.faults == rig.tracker.faults


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mig=st.booleans(), shared=st.booleans(), ops=st.lists(OPS, min_size=5, max_size=40))
def test_random_fault_sequences_keep_the_invariants(mig: bool, shared: bool, ops: list[tuple[Any, ...]]) -> None:
    sim = SimulatedNvml(H200, 2, mig_enabled=mig)
    if mig:
        for index in range(2):
            sim.create_gpu_instance(index, THREE_G.profile_id, THREE_G.placements[0])
    rig = Rig(sim, shared=shared)
    rig.observe()  # every GPU seen once, as the agent sees them at start
    between = Between()
    before: dict[DeviceKey, Any] = dict(rig.tracker.faults)
    for op in [*ops, ("observe",)]:
        if op[0] != "observe":
            if op[0] in ("create", "destroy") and not mig:
                continue
            _apply(rig, op, between)
            continue
        report = rig.observe()
        _check(rig, before, report, between)
        before, between = dict(report.faults), Between()


def test_read_signals_reports_a_gpu_lost_after_the_snapshot() -> None:
    sim = _sim(False)
    rig = Rig(sim)
    snap = rig.snapshot()
    sim.lose_gpu(1)
    signals, warnings = read_signals(sim, snap)
    assert signals.lost == frozenset({1}) and warnings == ()
    assert [e.xid for e in signals.xids] == [79]
    assert set(signals.memory) == {0} and set(signals.reset_markers) == {0}
    assert signals.boot_id == sim.boot_id()


def test_builtin_table_is_the_default() -> None:
    assert HealthTracker().table is BUILTIN
