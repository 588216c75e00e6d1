"""SharingPolicy status: what the controller made of each policy (controller.writes.policy_status)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from controller.writes.policy_status import needs_write, policy_reports, status_for
from sharing.api.crd import SharingPolicyStatus

NOW = datetime(2026, 12, 1, 7, 0, tzinfo=timezone.utc)
NODES = [("a1", {"pool": "a", "zone": "x"}), ("a2", {"pool": "a", "zone": "y"}), ("b1", {"pool": "b", "zone": "x"})]


def policy(name: str, spec: dict[str, Any], generation: int = 1, status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": name, "generation": generation}, "spec": spec}
    if status is not None:
        obj["status"] = status
    return obj


def cond(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def test_matched_nodes_overlap_and_validity_per_policy() -> None:
    policies = [
        policy("pool-a", {"nodeSelector": {"matchLabels": {"pool": "a"}}}),
        policy("zone-x", {"nodeSelector": {"matchLabels": {"zone": "x"}}}),
        policy("nowhere", {"nodeSelector": {"matchLabels": {"pool": "z"}}}),
        policy("broken", {"replicas": {"min": 4, "max": 2}}),
    ]
    reports = {r.name: r for r in policy_reports(policies, NODES)}
    assert reports["pool-a"].matched == ("a1", "a2") and reports["pool-a"].shared_with == ("zone-x",)
    assert reports["pool-a"].overlap == 1 and reports["zone-x"].matched == ("a1", "b1") and reports["zone-x"].overlap == 1
    assert reports["nowhere"].matched == () and reports["nowhere"].shared_with == ()
    assert reports["broken"].invalid is not None and "min must not exceed max" in reports["broken"].invalid
    assert reports["broken"].matched == ()

    a = status_for(reports["pool-a"], {}, NOW)
    SharingPolicyStatus.model_validate(a)
    assert a["matchedNodes"] == 2 and a["observedGeneration"] == 1 and a["appliedTime"] == "2026-12-01T07:00:00Z"
    assert (cond(a, "Ready")["status"], cond(a, "Ready")["reason"]) == ("True", "Applied")
    assert cond(a, "Overlapping")["status"] == "True" and "1 of its node(s) also selected by zone-x" in cond(a, "Overlapping")["message"]
    none = status_for(reports["nowhere"], {}, NOW)
    assert none["matchedNodes"] == 0 and cond(none, "Ready")["reason"] == "NoNodesSelected"
    assert cond(none, "Overlapping")["status"] == "False"
    bad = status_for(reports["broken"], {}, NOW)
    assert cond(bad, "Ready")["status"] == "False" and cond(bad, "Ready")["reason"] == "InvalidSpec"
    assert "appliedTime" not in bad and "replicas" in cond(bad, "Ready")["message"]


def test_a_steady_policy_is_not_rewritten_and_a_new_generation_is() -> None:
    first = status_for(policy_reports([policy("p", {})], NODES)[0], {}, NOW)
    later = NOW + timedelta(hours=1)
    again = status_for(policy_reports([policy("p", {}, status=first)], NODES)[0], first, later)
    assert again == first and not needs_write(first, again)  # times kept: nothing to write
    bumped = status_for(policy_reports([policy("p", {}, generation=2)], NODES)[0], first, later)
    assert needs_write(first, bumped) and bumped["appliedTime"] == "2026-12-01T08:00:00Z"
    # A node joining changes the count: written, but the policy was applied at the same time as before.
    grown = status_for(policy_reports([policy("p", {})], [*NODES, ("c1", {})])[0], first, later)
    assert needs_write(first, grown) and grown["matchedNodes"] == 4 and grown["appliedTime"] == first["appliedTime"]


def test_unnamed_objects_are_skipped() -> None:
    assert policy_reports([{"metadata": {}, "spec": {}}, {"spec": {}}], NODES) == []
