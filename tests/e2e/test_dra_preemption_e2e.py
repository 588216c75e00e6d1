"""Priority preemption on the DRA pool, on the real control plane (issue 36: the DRA path as the
device-plugin path, ``tests/e2e/test_priority_e2e.py``).

The DRA placement harness (``tests.e2e.test_dra_placement``: its own control plane with
kube-scheduler and kube-controller-manager, two kubelet-less Nodes labelled
``gpupack.io/backend=dra`` with two H100s each shared by MPS, published as ResourceSlices, their
GPUNodes, ``manifests/dra`` applied, the controller's cycle run by the test). Pods are created as the
webhook admits them to the DRA pool and name real PriorityClasses (a low one of value 0, a high one
of 1000 and a high one with ``preemptionPolicy: Never``), which the API server's Priority admission
resolves into ``spec.priority``.

Eight low pods of 500 milli fill the four GPUs; kube-scheduler allocates their claims and binds them.
Checked:

* a ``Never`` pod of the high class waits at the gate and preempts nobody;
* a high pod of 500 milli that fits nowhere gets exactly one victim (the fewest the plan needs),
  which carries ``DisruptionTarget`` (reason ``PreemptionByGpupack``), a ``Preempted`` Event naming the
  preemptor, and is deleted with its 30 s grace period; there is no kubelet, so it stays Terminating;
* the preemptor records its victim (``gpupack.io/preempting``) and stays at the gate while the victim
  exists, and later cycles preempt no second pod;
* once the test plays the kubelet (the victim force-deleted), kube-controller-manager collects the
  victim's ResourceClaim, the preemptor is released, kube-scheduler allocates its claim the very
  device the victim had and binds it there; the ``Never`` pod still waits.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, cast

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sharing.api.backend import pod_claim_name
from sharing.api.keys import PREEMPTION_REASON
from sharing.api.preempting import read_preempting
from tests.e2e.test_dra_placement import Pool, admin, plane, pool  # noqa: F401 - the harness's fixtures
from tests.e2e.test_dra_slices import TIMEOUT_S
from tests.e2e.waiting import wait_for
from tests.unit.test_controller_dra import dra_allocation, dra_pod

GRACE_S = 30
SHARE = 500


class Classes:
    """PriorityClasses of the test's own (cluster-scoped: removed after)."""

    def __init__(self, pool: Pool) -> None:
        self.scheduling = client.SchedulingV1Api(pool.core.api_client)
        self.run = pool.namespace
        self.made: list[str] = []

    def make(self, suffix: str, value: int, policy: str = "PreemptLowerPriority") -> str:
        name = f"{self.run}-{suffix}"
        self.scheduling.create_priority_class(cast(Any, {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
            "value": value, "preemptionPolicy": policy}))
        self.made.append(name)
        return name


@pytest.fixture
def classes(pool: Pool) -> Iterator[Classes]:
    made = Classes(pool)
    try:
        yield made
    finally:
        for name in made.made:
            made.scheduling.delete_priority_class(name)


def share_pod(pool: Pool, name: str, priority_class: str) -> str:
    """A DRA share pod as the webhook admits it, of ``priority_class``, with a grace period a
    kubelet-less node never ends."""
    allocation = dra_allocation("mps", pod_claim_name(str(uuid.uuid4())), milli=(SHARE,))
    body = dra_pod(name, pool.namespace, allocation,
                   extra={"priorityClassName": priority_class, "terminationGracePeriodSeconds": GRACE_S})
    pool.core.create_namespaced_pod(pool.namespace, cast(Any, body))
    return name


def existing(pool: Pool, name: str) -> Any:
    try:
        return pool.read(name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def terminating(pool: Pool, names_: list[str]) -> list[str]:
    return [n for n in names_ if (seen := existing(pool, n)) is None or seen.metadata.deletion_timestamp is not None]


def cycle(pool: Pool) -> Any:
    report = pool.controller.cycle()
    assert report.errors == [], report.errors
    return report


def test_a_high_share_preempts_one_low_share_and_gets_its_device(pool: Pool, classes: Classes) -> None:
    low, high = classes.make("low", 0), classes.make("high", 1000)
    never = classes.make("high-never", 1000, "Never")
    lows = [share_pod(pool, f"low-{i}", low) for i in range(2 * len(pool.nodes) * 2)]  # two shares a GPU
    report = cycle(pool)
    assert sorted(report.released) == sorted(f"{pool.namespace}/{n}" for n in lows)
    devices = {n: pool.allocated(n) for n in lows}  # kube-scheduler allocated and bound every one
    assert pool.read(lows[0]).spec.priority == 0  # the API server resolved the class

    # A Never pod of the high class waits: every GPU is full, and it may not preempt.
    waiter = share_pod(pool, "high-never", never)
    report = cycle(pool)
    assert report.preempted == [] and report.released == [] and pool.gated(waiter)
    assert pool.read(waiter).spec.priority == 1000
    assert terminating(pool, lows) == [], "a Never pod preempted"

    preemptor = share_pod(pool, "high", high)
    report = cycle(pool)
    (victim,) = [n.split("/", 1)[1] for n in report.preempted]  # one 500-milli share frees enough
    assert terminating(pool, lows) == [victim]
    doomed = pool.read(victim)  # no kubelet: it stays Terminating
    condition = next((c for c in doomed.status.conditions or [] if c.type == "DisruptionTarget"), None)
    assert condition is not None and condition.status == "True" and condition.reason == PREEMPTION_REASON
    assert f"{pool.namespace}/{preemptor}" in condition.message
    assert doomed.metadata.deletion_grace_period_seconds == GRACE_S, "deleted with its own grace period"
    events = pool.core.list_namespaced_event(pool.namespace, field_selector=f"involvedObject.name={victim}").items
    assert any(e.reason == "Preempted" and preemptor in (e.message or "") for e in events), events
    record = read_preempting(pool.read(preemptor).metadata.annotations)
    assert record is not None and record.victims == (doomed.metadata.uid,)

    # While the victim terminates the preemptor waits at the gate, and nobody else goes.
    for _ in range(3):
        report = cycle(pool)
        assert report.preempted == [] and report.released == []
        assert pool.gated(preemptor) and pool.gated(waiter)
        assert terminating(pool, lows) == [victim], "a second pod was preempted for one preemptor"

    # The test plays the kubelet: the victim's containers have stopped, the pod is gone.
    victim_claim = pool.claim_of(victim)
    pool.core.delete_namespaced_pod(victim, pool.namespace, grace_period_seconds=0)

    def collected() -> bool:
        found = pool.dra.claims.get(namespace=pool.namespace).to_dict()["items"]
        return victim_claim not in {c["metadata"]["name"] for c in found}

    wait_for(f"kube-controller-manager to delete ResourceClaim {victim_claim}", collected, TIMEOUT_S)
    report = cycle(pool)
    assert report.released == [f"{pool.namespace}/{preemptor}"] and report.preempted == []
    assert pool.allocated(preemptor) == devices[victim]  # the freed device, bound on its node
    assert pool.gated(waiter) and pool.read(waiter).spec.node_name is None, "the Never pod still waits"
    assert terminating(pool, lows) == [victim]
