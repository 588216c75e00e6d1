"""Quota for fractions through real Kueue (v0.17.0, built from its Go module), end to end.

The whole stack of ``gpupack demo`` (real control plane, gpupack's webhook called by the API server,
node agents on simulated NVML emulating the device plugin, the controller) plus Kueue's manager out of
cluster (``ControlPlaneConfig(kueue=...)``), with the two teams' queues of ``examples/kueue/queues.yaml``:
ClusterQueues ``team-a`` and ``team-b`` in the cohort ``gpus``, 1000 milli each, each may borrow 500.
One node, 3 x A100 shared by MPS into 4 replicas (12 replicas; Kueue counts one as 250 milli).

* team-a asks 8 replicas (2000 milli): Kueue admits 6 (its 1000 plus 500 borrowed from team-b),
  gpupack places them; the other 2 keep Kueue's gate beside gpupack's, are reported ``HeldByKueue``,
  and nothing is reshaped or split for them though 6 replicas are free;
* team-b's 2 pods fit its own quota: admitted and placed at once, the held ones notwithstanding;
* a pod of team-b asking 2000 milli, more than its ClusterQueue can ever give (1000 + 500 borrowed):
  its condition says Kueue can never admit it, in Kueue's words, with a Warning Event
  ``NeverAdmittedByKueue``, while team-a's held pods say they wait for quota (issue 36, bad input);
* team-a's pod of PriorityClass ``team-urgent`` makes Kueue preempt one of team-a's admitted pods
  (``withinClusterQueue: LowerPriority``); it is placed once its victim is gone, and nothing loops:
  no pod is admitted back to preempt in turn, the held ones stay held;
* Kueue down: a pod no queue holds is still created and placed; a queued pod is refused with the
  webhook's error, never run outside its quota.

The nodes have no kubelet: the test confirms a deleted pod's termination as a kubelet would
(``_kubelet_confirms``), so Kueue's preemption completes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from gpupack.demo.stack import DemoNode, Stack
from gpupack.devcluster.apply import apply_objects, load_manifests
from gpupack.devcluster.binaries import ensure_kueue
from gpupack.devcluster.errors import DevClusterError
from gpupack.testing.admission_reviews import gpu_container, make_pod
from sharing.api.kueue_workload import NEVER_EVENT
from sharing.api.keys import CAPACITY_GATE, KUEUE_ADMISSION_GATE, KUEUE_QUEUE_LABEL, PLACEMENT_CONDITION
from sharing.api.placement_status import HELD_BY_KUEUE
from tests.e2e.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
QUEUES = REPO / "examples" / "kueue" / "queues.yaml"
GROUP, VERSION = "gpupack.io", "v1alpha1"
NODE = DemoNode("mps-k", "A100-80GB", 3, sharing="mps", replicas=4)
TEAMS = ("team-a", "team-b")


@pytest.fixture(scope="module")
def kueue_binary(request: pytest.FixtureRequest) -> Path:
    """The pinned Kueue (tools/kueue/build.sh, or $GPUPACK_KUEUE), built here if not cached (minutes)."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    try:
        with capture.global_and_fixture_disabled():
            return ensure_kueue(progress=sys.stderr)
    except DevClusterError as exc:
        pytest.fail(f"cannot run this test: Kueue is unavailable.\n{exc}", pytrace=False)


@pytest.fixture
def stack(control_plane: Any, kueue_binary: Path, tmp_path: Path) -> Iterator[Stack]:
    running = Stack(tmp_path, nodes=(NODE,), kueue=kueue_binary, probe_sharing="mps")
    try:
        running.start(lambda _: None)
        core = client.CoreV1Api(running.admin)
        for team in TEAMS:
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=team)))
        apply_objects(running.admin, load_manifests(QUEUES))
        yield running
    finally:
        for name in ("controller", "kueue", "webhook"):
            path = (tmp_path / "cluster" / "logs" if name == "kueue" else tmp_path / "logs") / f"{name}.log"
            if path.exists():
                print(f"--- {name} ---\n{path.read_text(errors='replace')[-3000:]}")
        running.stop()


def _pod(core: Any, team: str, name: str, *, queued: bool = True, priority_class: str | None = None,
         replicas: int = 1) -> Any:
    labels = {KUEUE_QUEUE_LABEL: "gpus"} if queued else {}
    extra: dict[str, Any] = {"priorityClassName": priority_class} if priority_class else {}
    containers = [gpu_container("main" if i == 0 else f"c{i}", "250") for i in range(replicas)]
    body: Any = make_pod(*containers, name=name, namespace=team, mode="mps", labels=labels, **extra)
    return core.create_namespaced_pod(team, body)


def _pods(core: Any, team: str) -> dict[str, Any]:
    return {p.metadata.name: p for p in core.list_namespaced_pod(team).items}


def _gates(pod: Any) -> set[str]:
    return {g.name for g in pod.spec.scheduling_gates or []}


def _bound(core: Any, team: str) -> set[str]:
    return {n for n, p in _pods(core, team).items() if p.spec.node_name and not p.metadata.deletion_timestamp}


def _kubelet_confirms(core: Any) -> None:
    """What a kubelet does for a deleted pod on its node: confirm it terminated (grace 0)."""
    for team in TEAMS:
        for pod in core.list_namespaced_pod(team).items:
            if pod.metadata.deletion_timestamp and pod.spec.node_name:
                try:
                    core.delete_namespaced_pod(pod.metadata.name, team, grace_period_seconds=0)
                except ApiException as exc:
                    if exc.status != 404:
                        raise


def _placement_reason(pod: Any) -> str | None:
    return next((c.reason for c in pod.status.conditions or [] if c.type == PLACEMENT_CONDITION), None)


def _placement_message(pod: Any) -> str:
    return next((c.message or "" for c in pod.status.conditions or [] if c.type == PLACEMENT_CONDITION), "")


def _event_reasons(core: Any, team: str, name: str) -> set[str]:
    return {e.reason for e in core.list_namespaced_event(team, field_selector=f"involvedObject.name={name}").items}


def _gpunode(custom: Any) -> dict[str, Any]:
    return custom.get_cluster_custom_object(GROUP, VERSION, "gpunodes", NODE.name)  # type: ignore[no-any-return]


def test_two_teams_quota_borrowing_preemption_within_a_queue_and_kueue_down(stack: Stack) -> None:
    core = client.CoreV1Api(stack.admin)
    custom = client.CustomObjectsApi(stack.admin)
    wait_for("the node to share by MPS x4",
             lambda: ((_gpunode(custom).get("status") or {}).get("sharing") or {}).get("replicas") == 4)
    generation = _gpunode(custom)["metadata"]["generation"]

    # team-a asks 2000 milli: Kueue admits 1500 (nominal 1000 + 500 borrowed), gpupack places those.
    for i in range(8):
        _pod(core, "team-a", f"a{i}")
    admitted = wait_for("6 of team-a's pods bound", lambda: len(_bound(core, "team-a")) == 6 and _bound(core, "team-a"),
                        timeout_s=120)
    held = set(_pods(core, "team-a")) - admitted
    assert len(held) == 2
    for name in held:
        pod = _pods(core, "team-a")[name]
        # Both gates (Kueue v0.17 adds its topology gate too): gpupack lifts only its own, and not yet.
        assert _gates(pod) >= {CAPACITY_GATE, KUEUE_ADMISSION_GATE}, name
    wait_for("the held pods reported HeldByKueue",
             lambda: all(_placement_reason(_pods(core, "team-a")[n]) == HELD_BY_KUEUE for n in held), timeout_s=60)
    # 6 replicas are free, yet nothing was split or reshaped for the held pods, and none was placed.
    assert _gpunode(custom)["metadata"]["generation"] == generation
    assert all(not _pods(core, "team-a")[n].spec.node_name for n in held)

    # team-b within its own quota: placed while team-a's extra pods stay held.
    for i in range(2):
        _pod(core, "team-b", f"b{i}")
    wait_for("team-b's pods bound", lambda: len(_bound(core, "team-b")) == 2, timeout_s=90)
    assert all(KUEUE_ADMISSION_GATE in _gates(_pods(core, "team-a")[n]) for n in held)
    # The held pods wait their turn, in Kueue's words (its Workload's QuotaReserved condition).
    wait_for("the held pods' messages in Kueue's words",
             lambda: all("QuotaReserved=False (Pending)" in _placement_message(_pods(core, "team-a")[n])
                         for n in held), timeout_s=90)
    assert not any("never" in _placement_message(_pods(core, "team-a")[n]) for n in held)

    # Bad input: 8 replicas (2000 milli) where team-b's ClusterQueue can give at most 1500, ever.
    _pod(core, "team-b", "b-huge", replicas=8)
    wait_for("the over-quota pod said never admitted",
             lambda: _placement_message(_pods(core, "team-b")["b-huge"]).startswith("never admitted by Kueue"),
             timeout_s=90)
    huge = _pods(core, "team-b")["b-huge"]
    assert _placement_reason(huge) == HELD_BY_KUEUE and not huge.spec.node_name
    assert "maximum capacity" in _placement_message(huge), _placement_message(huge)
    wait_for("the NeverAdmittedByKueue Event", lambda: NEVER_EVENT in _event_reasons(core, "team-b", "b-huge"),
             timeout_s=30)

    # An urgent pod of team-a: Kueue preempts one of team-a's lower-priority pods; gpupack places it.
    _pod(core, "team-a", "urgent", priority_class="team-urgent")
    wait_for("the urgent pod bound", lambda: "urgent" in _bound(core, "team-a"), timeout_s=120,
             tick=lambda: _kubelet_confirms(core))
    victims = admitted - set(_pods(core, "team-a"))
    assert len(victims) == 1, victims
    # No loop: for a while nothing else is preempted, nothing held is admitted, the urgent pod stays.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        _kubelet_confirms(core)
        pods = _pods(core, "team-a")
        assert "urgent" in pods and pods["urgent"].metadata.deletion_timestamp is None
        assert set(pods) == (admitted - victims) | held | {"urgent"}
        assert all(KUEUE_ADMISSION_GATE in _gates(pods[n]) for n in held)
        time.sleep(1)
    assert _gpunode(custom)["metadata"]["generation"] == generation

    # Kueue down: a pod no queue holds is created and placed; a queued pod is refused, not run unquota'd.
    stack.plane.stop_component("kueue")  # type: ignore[union-attr]
    _pod(core, "team-b", "free", queued=False)
    wait_for("the unqueued pod bound while Kueue is down", lambda: "free" in _bound(core, "team-b"), timeout_s=90)
    with pytest.raises(ApiException) as refused:
        _pod(core, "team-b", "b-late")
    assert "mpod.kb.io" in (refused.value.body or ""), refused.value.body
