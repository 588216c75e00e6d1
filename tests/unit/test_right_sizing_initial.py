"""Right-sizing Initial: the pure sizing decision (``sharing.admission.right_sizing``), the records it
reads and writes (``sharing.api.recommendation``, ``sharing.api.right_sized``), the webhook's review
with a recommendation lookup, and the watch cache of GPURecommendations."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sharing.admission.inventory import Inventory, build_inventory
from sharing.admission.patch import apply_patch
from sharing.admission.right_sizing import RecommendationLookup, Sized, size_pod
from sharing.api.crd import RightSizingMode
from sharing.api.keys import ALLOCATION_ANNOTATION, RIGHT_SIZED_ANNOTATION, RIGHT_SIZING_LABEL
from sharing.api.recommendation import RecommendationError, RecommendationReading, read_recommendation
from sharing.api.request import PodRequest, parse_pod
from sharing.api.right_sized import RightSizedError, RightSizedFrom
from sharing.rules.right_sizing import RightSizing
from gpupack.testing.admission_reviews import gpu_container, make_pod, make_review
from tests.unit.test_informer import ScriptedLister, listing
from webhook.admission import review_pod
from webhook.recommendation_watch import RecommendationWatch
from webhook.settings import WebhookSettings

ROOT = Path(__file__).resolve().parents[2]
GI = 1024**3
NS = "ml"
HASH = "5d8f7c9b4"


def recommendation(name: str = "deployment-web", *, target: tuple[str, str] = ("Deployment", "web"),
                   provided: str | None = "True", containers: list[dict[str, Any]] | None = None,
                   namespace: str = NS, generation: int = 3) -> dict[str, Any]:
    status: dict[str, Any] = {
        "source": "Agents", "mode": "Initial", "lastUpdateTime": "2026-12-04T17:00:00Z",
        "containers": containers if containers is not None else [
            {"containerName": "main", "gpuMilli": 120, "gpuMemory": "16Gi", "observedSeconds": 86400,
             "confidenceDays": 1.0, "ooms": 0, "pods": 2}],
    }
    if provided is not None:
        status["conditions"] = [{"type": "RecommendationProvided", "status": provided, "reason": "Enough",
                                 "message": "", "lastTransitionTime": "2026-12-04T17:00:00Z"}]
    return {"apiVersion": "gpupack.io/v1alpha1", "kind": "GPURecommendation",
            "metadata": {"name": name, "namespace": namespace, "generation": generation, "resourceVersion": "7"},
            "spec": {"targetRef": {"kind": target[0], "name": target[1]}}, "status": status}


def lookup_of(*objects: dict[str, Any]) -> RecommendationLookup:
    readings = {(r.namespace, r.name): r for r in map(read_recommendation, objects)}
    return lambda namespace, name: readings.get((namespace, name))


def deployment_pod(*containers: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """A pod of Deployment ``web``, as its ReplicaSet creates it."""
    labels = {"pod-template-hash": HASH, **kwargs.pop("labels", {})}
    pod = make_pod(*containers, name=f"web-{HASH}-x1", namespace=NS, labels=labels, **kwargs)
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"web-{HASH}",
                                           "uid": "u", "controller": True}]
    return pod


def sized(pod: dict[str, Any], mode: RightSizingMode = "Initial", lookup: RecommendationLookup | None = None,
          largest_gpu_mib: int = 81920) -> tuple[PodRequest, Sized]:
    request = parse_pod(pod, NS)
    assert request is not None
    return request, size_pod(request, pod, RightSizing(mode), lookup if lookup is not None else lookup_of(
        recommendation()), largest_gpu_mib)


# ------------------------------------------------------------------ the pure decision


def test_initial_sizes_a_deployment_pod_from_its_recommendation() -> None:
    request, out = sized(deployment_pod(gpu_container("main", "1000", "40Gi")))
    (container,) = out.request.containers
    assert (container.milli, container.memory_bytes) == (120, 16 * GI)
    assert out.record is not None and out.record.recommendation == "deployment-web" and out.record.generation == 3
    (record,) = out.record.containers
    assert (record.asked_milli, record.asked_memory_bytes, record.milli, record.memory_bytes) == (
        1000, 40 * GI, 120, 16 * GI)
    assert "sized from GPURecommendation 'deployment-web'" in out.note and request.containers[0].milli == 1000


def test_recreate_sizes_new_pods_too() -> None:
    _, out = sized(deployment_pod(gpu_container("main", "1000")), mode="Recreate")
    assert out.record is not None and out.request.containers[0].milli == 120


@pytest.mark.parametrize(("lookup", "expected"), [
    pytest.param(lookup_of(), "no GPURecommendation 'deployment-web' for ml/Deployment/web", id="no-recommendation"),
    pytest.param(lookup_of(recommendation(provided="False")), "no RecommendationProvided=True yet",
                 id="not-enough-history"),
    pytest.param(lookup_of(recommendation(provided=None)), "no RecommendationProvided=True yet", id="no-conditions"),
    pytest.param(lookup_of(recommendation(target=("StatefulSet", "web"))), "is for ml/StatefulSet/web",
                 id="other-target"),
    pytest.param(lookup_of(recommendation(containers=[
        {"containerName": "sidecar", "gpuMilli": 10, "gpuMemory": "1Gi"}])),
        "recommends nothing for container(s) 'main'",
        id="no-entry-for-the-container"),
])
def test_a_pod_without_a_usable_recommendation_keeps_its_request(lookup: RecommendationLookup, expected: str) -> None:
    request, out = sized(deployment_pod(gpu_container("main", "1000", "40Gi")), lookup=lookup)
    assert out.request == request and out.record is None
    assert expected in out.note and out.note.endswith("not sized")


def test_an_off_namespace_is_never_sized_and_says_nothing() -> None:
    request, out = sized(deployment_pod(gpu_container("main", "1000")), mode="Off")
    assert out == Sized(request)


def test_before_the_recommendations_are_synced_nothing_is_sized() -> None:
    pod = deployment_pod(gpu_container("main", "1000"))
    request = parse_pod(pod, NS)
    assert request is not None
    out = size_pod(request, pod, RightSizing("Initial"), None, 81920)
    assert out.request == request and "holds no GPURecommendations" in out.note


def test_multi_container_pods_size_only_the_containers_recommended() -> None:
    lookup = lookup_of(recommendation(containers=[
        {"containerName": "main", "gpuMilli": 300, "gpuMemory": "20Gi"},
        {"containerName": "warmup", "gpuMilli": 50, "gpuMemory": "2Gi"}]))
    pod = deployment_pod(gpu_container("main", "1000"), gpu_container("aux", "200", "8Gi"),
                         init=[gpu_container("warmup", "500", "10Gi")])
    _, out = sized(pod, lookup=lookup)
    by_name = {c.name: (c.milli, c.memory_bytes) for c in out.request.containers}
    assert by_name == {"warmup": (50, 2 * GI), "main": (300, 20 * GI), "aux": (200, 8 * GI)}
    assert out.record is not None and [c.name for c in out.record.containers] == ["warmup", "main"]
    assert out.record.containers[1].asked_memory_bytes is None  # main asked no memory: the policy default


def test_memory_is_never_below_the_recommendation_even_above_the_request() -> None:
    """An OOM raised the recommendation: the next pod gets more memory than its spec asks."""
    lookup = lookup_of(recommendation(containers=[{"containerName": "main", "gpuMilli": 0, "gpuMemory": "60Gi"}]))
    _, out = sized(deployment_pod(gpu_container("main", "500", "30Gi")), lookup=lookup)
    (container,) = out.request.containers
    assert container.memory_bytes == 60 * GI
    assert container.milli == 1  # a recommendation of 0 milli still asks for the least share there is


def test_a_recommendation_larger_than_any_gpu_leaves_the_pod_as_asked() -> None:
    lookup = lookup_of(recommendation(containers=[{"containerName": "main", "gpuMilli": 400, "gpuMemory": "90Gi"}]))
    request, out = sized(deployment_pod(gpu_container("main", "1000", "70Gi")), lookup=lookup)
    assert out.request == request and out.record is None and "more than the largest GPU (80Gi)" in out.note


def test_a_bare_pod_is_its_own_workload() -> None:
    pod = make_pod(gpu_container("main", "1000"), name="solo", namespace=NS)
    _, out = sized(pod, lookup=lookup_of(recommendation("pod-solo", target=("Pod", "solo"))))
    assert out.record is not None and out.record.recommendation == "pod-solo"


# ------------------------------------------------------------------ the records


def test_reading_keeps_sizes_in_bytes_and_the_condition() -> None:
    reading = read_recommendation(recommendation())
    assert reading.provided and reading.generation == 3 and reading.updated == "2026-12-04T17:00:00Z"
    main = reading.size_of("main")
    assert main is not None and (main.milli, main.memory_bytes) == (120, 16 * GI)
    assert reading.size_of("other") is None


@pytest.mark.parametrize(("change", "message"), [
    pytest.param(lambda o: o["status"]["containers"][0].update(gpuMilli=2000), "status.containers.0.gpuMilli",
                 id="milli-over-a-gpu"),
    pytest.param(lambda o: o["status"]["containers"][0].update(gpuMemory="lots"), "status.containers.0.gpuMemory",
                 id="memory-not-a-quantity"),
    pytest.param(lambda o: o["metadata"].pop("namespace"), "metadata.namespace is missing", id="no-namespace"),
    pytest.param(lambda o: o["spec"].pop("targetRef"), "spec.targetRef", id="no-target"),
])
def test_an_invalid_recommendation_is_refused_with_where(change: Any, message: str) -> None:
    obj = recommendation()
    change(obj)
    with pytest.raises(RecommendationError, match=message.replace(".", r"\.")):
        read_recommendation(obj)


def test_the_right_sized_record_round_trips_and_refuses_bad_text() -> None:
    _, out = sized(deployment_pod(gpu_container("main", "1000", "40Gi")))
    assert out.record is not None
    assert RightSizedFrom.from_annotation(out.record.to_annotation()) == out.record
    for bad, why in (("[]", "not a JSON object"), ('{"version":"v0"}', "version"),
                     ('{"version":"v1","recommendation":"r","generation":1,"containers":[{"name":"m"}]}',
                      "askedMilli")):
        with pytest.raises(RightSizedError, match=why):
            RightSizedFrom.from_annotation(bad)


# ------------------------------------------------------------------ the webhook's review


@pytest.fixture(scope="module")
def inventory() -> Inventory:
    objects = yaml.safe_load((ROOT / "examples" / "inventory.yaml").read_text())
    namespaces = [{"kind": "Namespace", "metadata": {"name": NS, "labels": {RIGHT_SIZING_LABEL: "Initial"}}},
                  {"kind": "Namespace", "metadata": {"name": "off", "labels": {RIGHT_SIZING_LABEL: "Off"}}}]
    return build_inventory([*objects, *namespaces])


def admitted(pod: dict[str, Any], inventory: Inventory, namespace: str = NS,
             lookup: RecommendationLookup | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    review = make_review(pod, namespace=namespace)
    answer = review_pod(review, inventory, WebhookSettings(), None,
                        lookup if lookup is not None else lookup_of(recommendation(namespace=namespace)))
    out = answer.review["response"]
    assert out["allowed"], out
    patch = json.loads(base64.b64decode(out["patch"])) if "patch" in out else []
    return apply_patch(pod, patch), out


def test_the_webhook_decides_the_sized_request_by_the_normal_path(inventory: Inventory) -> None:
    pod, out = admitted(deployment_pod(gpu_container("main", "1000", "40Gi"), mode="mps"), inventory)
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu.shared": "1"}
    assert {e["name"]: e["value"] for e in container["env"]} == {
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=16384M"}
    allocation = json.loads(pod["metadata"]["annotations"][ALLOCATION_ANNOTATION])
    assert allocation["containers"][0]["milli"] == 120
    record = RightSizedFrom.from_annotation(pod["metadata"]["annotations"][RIGHT_SIZED_ANNOTATION])
    assert record.containers[0].asked_milli == 1000 and "sized from GPURecommendation" in out["status"]["message"]
    # Reinvoked, the webhook sees its own records and changes nothing.
    again = review_pod(make_review(pod, namespace=NS), inventory, WebhookSettings(), None, lookup_of(recommendation()))
    assert again.review["response"]["allowed"] and "patch" not in again.review["response"]


def test_mig_gets_the_smallest_profile_covering_the_recommendation(inventory: Inventory) -> None:
    pod, _ = admitted(deployment_pod(gpu_container("main", "1000"), mode="mig"), inventory)
    # One seventh of the compute covers 120 milli; 20 GB cover 16Gi.
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.20gb": "1"}


def test_an_off_namespace_and_a_skipped_pod_are_untouched(inventory: Inventory) -> None:
    pod, out = admitted(deployment_pod(gpu_container("main", "1000"), mode="mps"), inventory, namespace="off")
    assert RIGHT_SIZED_ANNOTATION not in pod["metadata"]["annotations"]
    assert json.loads(pod["metadata"]["annotations"][ALLOCATION_ANNOTATION])["containers"][0]["milli"] == 1000
    assert "right-sizing" not in out["status"]["message"]
    skipped = deployment_pod(gpu_container("main", "1000"), labels={"gpupack.io/skip": "true"})
    pod, out = admitted(skipped, inventory)
    assert pod == skipped and "left untouched" in out["status"]["message"]


def test_a_hand_written_right_sized_record_is_removed_or_refused(inventory: Inventory) -> None:
    forged = RightSizedFrom.from_annotation(
        '{"version":"v1","recommendation":"x","generation":1,"updated":null,"containers":[{"name":"main",'
        '"askedMilli":1,"askedMemoryBytes":null,"milli":1,"memoryBytes":1}]}').to_annotation()
    # On a pod the webhook decides but does not size (no recommendation), the record goes.
    pod, _ = admitted(deployment_pod(gpu_container("main", "500"), annotations={RIGHT_SIZED_ANNOTATION: forged}),
                      inventory, lookup=lookup_of())
    assert RIGHT_SIZED_ANNOTATION not in pod["metadata"]["annotations"]
    # On a pod that asks for nothing of gpupack and carries no allocation record, it is refused.
    plain = make_pod({"name": "web", "image": "x"}, namespace=NS, annotations={RIGHT_SIZED_ANNOTATION: forged})
    answer = review_pod(make_review(plain, namespace=NS), inventory, WebhookSettings(), None, lookup_of())
    out = answer.review["response"]
    assert not out["allowed"] and RIGHT_SIZED_ANNOTATION in out["status"]["message"]


# ------------------------------------------------------------------ the watch cache


def test_the_watch_keeps_readings_by_namespace_and_name_and_leaves_bad_objects_out() -> None:
    good = recommendation()
    bad = recommendation("deployment-bad", containers=[{"containerName": "main", "gpuMilli": 5000, "gpuMemory": "1Gi"}])
    for obj in (good, bad):  # as a list gives them: no apiVersion or kind on the items
        obj.pop("apiVersion")
        obj.pop("kind")
    good["metadata"]["managedFields"] = [{"manager": "controller"}]
    watch = RecommendationWatch(ScriptedLister([listing("9", good, bad)], []))
    assert not watch.synced
    watch.informer.relist()
    assert watch.synced and len(watch) == 1
    reading = watch.lookup(NS, "deployment-web")
    assert isinstance(reading, RecommendationReading) and reading.provided
    assert watch.lookup(NS, "deployment-bad") is None and watch.lookup("other", "deployment-web") is None
    assert "gpuMilli" in watch.informer.rejected[f"{NS}/deployment-bad"]
    assert set(watch.informer.get(f"{NS}/deployment-web") or {}) == {"metadata", "reading"}  # no managedFields
