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

The MIG trial too (``controller.planning.dra_mig_preemption``): a third DRA node of one H100 in MIG
mode whose agent reports two ``3g.40gb`` instances, no SharingPolicy selecting it (nothing may be
created there), two low ``3g.40gb`` pods on them; a high ``3g.40gb`` pod preempts exactly one, waits
while it terminates, and once it is gone is bound to the very instance it held.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, cast

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sharing.api.backend import pod_claim_name
from sharing.api.keys import BACKEND_LABEL, PREEMPTION_REASON
from sharing.api.preempting import read_preempting
from sharing.dra import names
from sharing.dra.mig_devices import mig_gpu
from tests.e2e.test_dra_placement import H100, Pool, admin, plane, pool  # noqa: F401 - the harness's fixtures
from tests.e2e.test_dra_slices import TIMEOUT_S, gpu_uuid
from tests.e2e.waiting import wait_for
from tests.unit.test_controller_dra import dra_allocation, dra_pod, gpunode

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


def share_pod(pool: Pool, name: str, priority_class: str, profile: str | None = None) -> str:
    """A DRA pod as the webhook admits it, of ``priority_class``, with a grace period a kubelet-less
    node never ends: a share of ``SHARE`` milli, or an instance of ``profile``."""
    claim = pod_claim_name(str(uuid.uuid4()))
    allocation = dra_allocation("mps", claim, milli=(SHARE,)) if profile is None else \
        dra_allocation("mig", claim, milli=(300,), profiles=(profile,))
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


def play_the_kubelet(pool: Pool, victim: str) -> None:
    """The victim's containers have stopped: the pod is gone (grace 0), and kube-controller-manager
    collects its ResourceClaim."""
    claim = pool.claim_of(victim)
    pool.core.delete_namespaced_pod(victim, pool.namespace, grace_period_seconds=0)

    def collected() -> bool:
        found = pool.dra.claims.get(namespace=pool.namespace).to_dict()["items"]
        return claim not in {c["metadata"]["name"] for c in found}

    wait_for(f"kube-controller-manager to delete ResourceClaim {claim}", collected, TIMEOUT_S)


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
    play_the_kubelet(pool, victim)
    report = cycle(pool)
    assert report.released == [f"{pool.namespace}/{preemptor}"] and report.preempted == []
    assert pool.allocated(preemptor) == devices[victim]  # the freed device, bound on its node
    assert pool.gated(waiter) and pool.read(waiter).spec.node_name is None, "the Never pod still waits"
    assert terminating(pool, lows) == [victim]


THREE = "3g.40gb"


def mig_node(pool: Pool) -> str:
    """A DRA node of one H100 in MIG mode, its agent reporting two ``3g.40gb`` instances (starts 0 and
    4) and no SharingPolicy selecting it: no new placement may be created there, only those two used."""
    name, _ = pool.dra.node("m", lambda node: [mig_gpu(H100, 0, gpu_uuid(node, 0))])
    pool.core.patch_node(name, {"metadata": {"labels": {BACKEND_LABEL: "dra"}}})
    body = gpunode(name, 1, sharing="none")
    status = body.pop("status")
    status["gpus"][0].update(migEnabled=True, instances=[{"profile": THREE, "start": s, "size": 4} for s in (0, 4)])
    pool.custom.create_cluster_custom_object("gpupack.io", "v1alpha1", "gpunodes", body)
    pool.custom.patch_cluster_custom_object_status("gpupack.io", "v1alpha1", "gpunodes", name, {"status": status})
    pool.nodes.append(name)  # the pool's close removes it
    return name


def instance(pool: Pool, pod: str) -> tuple[str, str]:
    """(node, device) of a MIG pod once bound: kube-scheduler allocates its claim before it binds (an
    instance has no consumed capacity, which ``Pool.allocated`` reads)."""
    node = pool.dra.bound(pod)
    return node, pool.dra.device(pool.claim_of(pod))


def test_a_high_mig_pod_preempts_one_low_instance_and_gets_it(pool: Pool, classes: Classes) -> None:
    """The DRA pool's MIG trial (``controller.planning.dra_mig_preemption``): the victim's instance,
    left to the pod, is taken as itself (``mig-instance``)."""
    node = mig_node(pool)
    low, high = classes.make("low", 0), classes.make("high", 1000)
    lows = [share_pod(pool, f"low-{i}", low, THREE) for i in range(2)]
    report = cycle(pool)
    assert sorted(report.released) == sorted(f"{pool.namespace}/{n}" for n in lows)
    devices = {n: instance(pool, n) for n in lows}
    assert sorted(devices.values()) == [(node, names.mig_device_name(0, THREE, s)) for s in (0, 4)]

    preemptor = share_pod(pool, "high", high, THREE)
    report = cycle(pool)
    (victim,) = [n.split("/", 1)[1] for n in report.preempted]
    doomed = pool.read(victim)
    condition = next((c for c in doomed.status.conditions or [] if c.type == "DisruptionTarget"), None)
    assert condition is not None and condition.reason == PREEMPTION_REASON
    assert doomed.metadata.deletion_grace_period_seconds == GRACE_S
    record = read_preempting(pool.read(preemptor).metadata.annotations)
    assert record is not None and record.victims == (doomed.metadata.uid,)
    for _ in range(2):
        report = cycle(pool)
        assert report.preempted == [] and report.released == [] and pool.gated(preemptor)
        assert terminating(pool, lows) == [victim]

    play_the_kubelet(pool, victim)
    report = cycle(pool)
    assert report.released == [f"{pool.namespace}/{preemptor}"] and report.preempted == []
    assert instance(pool, preemptor) == devices[victim]  # the very instance the victim had
    assert terminating(pool, lows) == [victim]
