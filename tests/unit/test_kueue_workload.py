"""Kueue's verdict on a pod it holds (``sharing.api.kueue_workload``): the Workload reader, the
"never admitted" reading of Kueue's words, and the ``HeldByKueue`` message chosen from them."""

from __future__ import annotations

from typing import Any

import pytest

from sharing.api.kueue_workload import (
    KueueVerdict, WorkloadUnreadable, held_message, never_admitted, read_workload, verdicts_by_pod,
)

# Kueue v0.17's words (pkg/scheduler/flavorassigner/flavorassigner.go, pkg/controller/core/workload_controller.go).
BEYOND = ("couldn't assign flavors to pod set main: insufficient quota for gpupack.io/gpu-milli in flavor "
          "gpupack-gpus, previously considered podsets requests (0) + current podset request (2) > maximum "
          "capacity (1500m)")
BUSY = ("couldn't assign flavors to pod set main: insufficient unused quota for gpupack.io/gpu-milli in flavor "
        "gpupack-gpus, 250m more needed")
UNCOVERED = "couldn't assign flavors to pod set main: resource nvidia.com/gpu unavailable in ClusterQueue"


def workload(*conditions: dict[str, Any], owners: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    owner = [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "uid-p", "controller": True}]
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": "pod-p-1a2b3", "namespace": "team", "ownerReferences": owner if owners is None else owners},
            "spec": {"queueName": "gpus", "podSets": [{"name": "main", "count": 1}]},
            "status": {"conditions": list(conditions)}, **extra}


def cond(type_: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2026-12-05T00:00:00Z", "observedGeneration": 1}


@pytest.mark.parametrize(("reason", "message", "never"), [
    ("Pending", BEYOND, True),
    ("Pending", UNCOVERED, True),
    ("Inadmissible", "LocalQueue gpus doesn't exist", True),
    ("Inadmissible", "ClusterQueue team-c doesn't exist", True),
    ("Pending", BUSY, False),
    # One flavor beyond its capacity, another only busy: waiting helps there.
    ("Pending", f"{BEYOND}, {BUSY.split(': ', 1)[1]}", False),
    ("Pending", "", False),
], ids=["beyond-capacity", "resource-not-covered", "no-localqueue", "no-clusterqueue", "quota-busy",
        "one-flavor-busy", "no-words"])
def test_never_admitted_reads_kueues_words(reason: str, message: str, never: bool) -> None:
    assert never_admitted(reason, message) is never


def test_a_pending_workload_reads_as_its_quota_reserved_condition() -> None:
    verdict = read_workload(workload(cond("QuotaReserved", "False", "Pending", BEYOND),
                                     cond("Admitted", "False", "NoReservation", "The workload has no reservation")))
    assert verdict == KueueVerdict("team/pod-p-1a2b3", ("uid-p",), "QuotaReserved", "False", "Pending", BEYOND)
    assert verdict.never


def test_an_admitted_workload_is_never_never() -> None:
    verdict = read_workload(workload(cond("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue team-a"),
                                     cond("Admitted", "True", "Admitted", "The workload is admitted")))
    assert (verdict.condition, verdict.status, verdict.never) == ("Admitted", "True", False)


def test_unknown_fields_and_conditions_are_ignored() -> None:
    verdict = read_workload(workload(cond("PodsReady", "False", "PodsReady"), cond("Mystery", "True", "X"),
                                     future={"anything": [1, 2]}))
    assert (verdict.condition, verdict.never) == ("", False)


@pytest.mark.parametrize(("obj", "names"), [
    ({"metadata": {"namespace": "team"}}, "metadata.name"),
    (workload(owners=[]), "ownerReference of kind Pod"),
    (workload(owners=[{"kind": "Job", "uid": "u"}]), "ownerReference of kind Pod"),
    ({**workload(), "status": {"conditions": "Pending"}}, "status.conditions"),
    ({**workload(), "status": {"conditions": ["Pending"]}}, "status.conditions"),
], ids=["no-name", "no-owner", "owner-not-a-pod", "conditions-not-a-list", "condition-not-a-map"])
def test_a_malformed_workload_is_refused_naming_the_field(obj: dict[str, Any], names: str) -> None:
    with pytest.raises(WorkloadUnreadable, match=names):
        read_workload(obj)


def test_verdicts_by_pod_keeps_the_readable_and_says_why_of_the_rest() -> None:
    good = workload(cond("QuotaReserved", "False", "Pending", BUSY))
    verdicts, unreadable = verdicts_by_pod([good, {"metadata": {"name": "w", "namespace": "team"}}])
    assert set(verdicts) == {"uid-p"} and verdicts["uid-p"].message == BUSY
    assert len(unreadable) == 1 and "team/w" in unreadable[0]


def held(verdict: KueueVerdict | None, *, read: bool = True, waited: float = 60.0) -> str:
    return held_message(verdict, workloads_read=read, waited_s=waited, no_workload_after_s=30)


def test_the_held_message_carries_kueues_words() -> None:
    busy = KueueVerdict("team/w", ("u",), "QuotaReserved", "False", "Pending", BUSY)
    beyond = KueueVerdict("team/w", ("u",), "QuotaReserved", "False", "Pending", BEYOND)
    assert held(busy).startswith(f"held by Kueue: QuotaReserved=False (Pending): {BUSY}")
    assert held(beyond).startswith("never admitted by Kueue as its queues stand")
    assert held(beyond).endswith(f"QuotaReserved=False (Pending): {BEYOND}")
    assert "never" not in held(busy)


def test_no_workload_says_whether_kueue_runs() -> None:
    assert "no Kueue Workload for this pod after 60s: is Kueue running?" in held(None)
    assert "not created yet" in held(None, waited=5) and "is Kueue running" not in held(None, waited=5)
    assert "cannot be read: is Kueue installed and running?" in held(None, read=False)
