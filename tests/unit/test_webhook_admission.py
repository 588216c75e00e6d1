"""``mutate``/``validate`` called as functions (STYLE.md #3): envelopes, skips, denials, dry runs."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sharing.admission import decision as decision_module
from sharing.admission.decision import DecisionMemo, decide
from sharing.admission.inventory import Inventory, build_inventory
from sharing.admission.patch import apply_patch
from sharing.api.request import parse_pod
from webhook.admission import mutate, review_pod, uid_hint, validate
from webhook.settings import WebhookSettings
from gpupack.testing.admission_reviews import gpu_container, make_pod, make_review

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = WebhookSettings()


@pytest.fixture(scope="module")
def inventory() -> Inventory:
    return build_inventory(yaml.safe_load((ROOT / "examples" / "inventory.yaml").read_text()))


def response(review: Any, inventory: Inventory) -> dict[str, Any]:
    answer = mutate(review, inventory, SETTINGS)
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    return answer["response"]


def patched(review: dict[str, Any], inventory: Inventory) -> dict[str, Any]:
    out = response(review, inventory)
    assert out["allowed"] and out["patchType"] == "JSONPatch"
    return apply_patch(review["request"]["object"], json.loads(base64.b64decode(out["patch"])))


def test_mig_pod_mutated_with_uid(inventory: Inventory) -> None:
    review = make_review(make_pod(gpu_container("c", "100")), uid="abc-123")
    out = response(review, inventory)
    assert out["uid"] == "abc-123" and out["allowed"]
    pod = patched(review, inventory)
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}


def test_pod_without_gpupack_resources_untouched(inventory: Inventory) -> None:
    pod = make_pod({"name": "web", "image": "nginx", "resources": {"limits": {"nvidia.com/gpu": "2"}}})
    out = response(make_review(pod), inventory)
    assert out["allowed"] and "patch" not in out and "untouched" in out["status"]["message"]


def test_skip_label_leaves_pod_untouched(inventory: Inventory) -> None:
    pod = make_pod(gpu_container("c", "5000"), labels={"gpupack.io/skip": "true"})  # invalid, yet skipped
    out = response(make_review(pod), inventory)
    assert out["allowed"] and "patch" not in out and "gpupack.io/skip" in out["status"]["message"]


def test_invalid_request_denied_with_reason_and_message(inventory: Inventory) -> None:
    out = response(make_review(make_pod(gpu_container("trainer", "0"))), inventory)
    assert not out["allowed"]
    assert out["status"]["code"] == 403
    assert "'trainer'" in out["status"]["message"] and "1..1000" in out["status"]["message"]
    assert out["status"]["details"]["causes"][0]["reason"] == "MilliOutOfRange"


def test_forbidden_mode_message(inventory: Inventory) -> None:
    objects = yaml.safe_load((ROOT / "examples" / "inventory.yaml").read_text())
    objects.append(yaml.safe_load((ROOT / "examples" / "sharing-policy.yaml").read_text()))
    strict = build_inventory(objects)
    review = make_review(make_pod(gpu_container(), mode="mps", namespace="team-isolated"), namespace="team-isolated")
    out = response(review, strict)
    assert not out["allowed"]
    assert "forbidden in namespace 'team-isolated'" in out["status"]["message"]
    assert "allowed modes: mig" in out["status"]["message"]


def test_dry_run_answers_identically_and_changes_nothing(inventory: Inventory) -> None:
    pod = make_pod(gpu_container("c", "250", "16Gi"), mode="mps")
    real, dry = make_review(pod, uid="u"), make_review(copy.deepcopy(pod), uid="u", dry_run=True)
    memo = DecisionMemo(inventory)
    first = review_pod(real, inventory, SETTINGS, memo).review
    assert first == review_pod(dry, inventory, SETTINGS, memo).review == mutate(real, inventory, SETTINGS)
    assert dry["request"]["object"] == pod
    assert inventory.nodes == build_inventory(yaml.safe_load((ROOT / "examples" / "inventory.yaml").read_text())).nodes


def test_the_webhooks_memo_answers_as_a_fresh_decision_and_only_for_its_snapshot(
    inventory: Inventory, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = parse_pod(make_pod(gpu_container("c", "250", "16Gi"), mode="mps"), "default")
    assert request is not None
    fresh = decide(request, inventory.policy_for("default"), inventory)
    worked_out = []
    original = decision_module._choose_uncached
    monkeypatch.setattr(decision_module, "_choose_uncached", lambda *a: worked_out.append(a) or original(*a))
    memo = DecisionMemo(inventory)
    assert decide(request, memo.policy_for("default"), inventory, memo=memo) == fresh
    assert decide(request, memo.policy_for("default"), inventory, memo=memo) == fresh
    assert len(worked_out) == 1  # the second answer came from the memo
    # A memo of another snapshot is never consulted: the empty cluster's answer is worked out.
    empty = build_inventory([])
    decide(request, empty.policy_for("default"), empty, memo=memo)
    decide(request, empty.policy_for("default"), empty, memo=memo)
    assert len(worked_out) == 3


def test_reinvocation_is_idempotent(inventory: Inventory) -> None:
    review = make_review(make_pod(gpu_container("c", "100"), annotations={"a": "b"}))
    once = patched(review, inventory)
    again = response(make_review(once), inventory)
    assert again["allowed"] and "patch" not in again


def test_update_and_subresources_pass(inventory: Inventory) -> None:
    update = make_review(make_pod(gpu_container("c", "0")), operation="UPDATE")
    assert response(update, inventory)["allowed"]
    sub = make_review(make_pod(gpu_container("c", "0")))
    sub["request"]["subResource"] = "ephemeralcontainers"
    assert response(sub, inventory)["allowed"]


def test_non_pod_objects_pass(inventory: Inventory) -> None:
    review = make_review({"kind": "ConfigMap", "data": {}}, kind="ConfigMap")
    out = response(review, inventory)
    assert out["allowed"] and "not a pod" in out["status"]["message"]


def test_gated_pod_gets_a_warning() -> None:
    inventory = build_inventory([])
    out = response(make_review(make_pod(gpu_container("c", "100"), mode="mps")), inventory)
    assert out["allowed"] and "gpupack.io/capacity" in out["warnings"][0]


def test_unsynced_inventory_denies_gpu_pods_only() -> None:
    unsynced = Inventory(synced=False)
    out = response(make_review(make_pod(gpu_container())), unsynced)
    assert not out["allowed"] and "not synced" in out["status"]["message"]
    assert out["status"]["details"]["causes"][0]["reason"] == "InventoryNotSynced"
    plain = response(make_review(make_pod({"name": "c", "image": "x"})), unsynced)
    assert plain["allowed"]


@pytest.mark.parametrize(
    ("review", "fragment", "uid"),
    [
        ([], "not a JSON object", ""),
        ({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "x"}}, "v1beta1", "x"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "Review", "request": {"uid": "y"}}, "'Review'", "y"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, "no request", ""),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"kind": {}}}, "uid", ""),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": 5}}, "uid", ""),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "z"}}, "request.kind", "z"),
    ],
    ids=["not-object", "v1beta1", "wrong-kind", "no-request", "no-uid", "uid-not-string", "no-kind"],
)
def test_malformed_envelopes_denied_with_uid(review: Any, fragment: str, uid: str, inventory: Inventory) -> None:
    out = response(review, inventory)
    assert out["allowed"] is False and out["uid"] == uid
    assert out["status"]["code"] == 400 and fragment in out["status"]["message"]


def test_pod_object_missing_or_wrong_kind_denied(inventory: Inventory) -> None:
    for obj in (None, "pod", {"kind": "Deployment", "spec": {}}):
        out = response(make_review(obj, uid="k"), inventory)
        assert not out["allowed"] and out["uid"] == "k" and "not a Pod" in out["status"]["message"]


def test_internal_errors_are_denials_not_exceptions(inventory: Inventory, monkeypatch: pytest.MonkeyPatch) -> None:
    import webhook.admission as admission

    def boom(*_: Any) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(admission, "decide", boom)
    answer = review_pod(make_review(make_pod(gpu_container()), uid="e"), inventory, SETTINGS)
    assert answer.outcome == "error" and answer.review["response"]["uid"] == "e"
    assert not answer.review["response"]["allowed"]


def test_uid_hint_reads_uid_from_unparsable_bodies() -> None:
    assert uid_hint(b'{"request": {"uid": "1234-abcd", "object": {') == "1234-abcd"
    assert uid_hint(b"\xff\xfe garbage") == ""


# --- /validate: SharingPolicy --------------------------------------------------------


def policy_review(spec: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    obj = {"apiVersion": "gpupack.io/v1alpha1", "kind": "SharingPolicy", "metadata": {"name": "p"}, "spec": spec}
    return make_review(obj, kind="SharingPolicy", group="gpupack.io", version="v1alpha1", operation=operation)


def test_example_policy_is_valid() -> None:
    obj = yaml.safe_load((ROOT / "examples" / "sharing-policy.yaml").read_text())
    review = make_review(obj, kind="SharingPolicy", group="gpupack.io", version="v1alpha1")
    assert validate(review, Inventory(), SETTINGS)["response"]["allowed"]


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"allowedProfiles": ["5g.99gb"]}, "'5g.99gb' is not a MIG profile"),
        ({"namespaces": [{"names": ["a"], "allowedModes": ["vgpu"]}]}, "namespaces.0.allowedModes.0"),
        ({"namespaces": [{"names": ["a"], "allowedModes": ["mig", "mig"]}]}, "lists a mode twice"),
        ({"defaultGpuMemory": "900Gi"}, "larger than any known GPU"),
        ({"bogus": 1}, "bogus"),
        ({"layout": {"mode": "static", "instances": [{"profile": "1g.10gb"}]}, "allowedProfiles": ["2g.20gb"]}, "not in spec.allowedProfiles"),
    ],
    ids=["unknown-profile", "unknown-mode", "duplicate-mode", "memory-too-large", "unknown-field", "layout-outside-allowed"],
)
def test_invalid_policies_denied(spec: dict[str, Any], fragment: str) -> None:
    out = validate(policy_review(spec), Inventory(), SETTINGS)["response"]
    assert not out["allowed"] and fragment in out["status"]["message"], out["status"]["message"]


def test_unknown_mig_config_is_a_warning_only() -> None:
    out = validate(policy_review({"layout": {"mode": "static", "migConfig": "site-custom"}}), Inventory(), SETTINGS)["response"]
    assert out["allowed"] and "site-custom" in out["warnings"][0]


def test_policy_delete_and_other_kinds_pass() -> None:
    assert validate(policy_review({"allowedProfiles": ["bad"]}, operation="DELETE"), Inventory(), SETTINGS)["response"]["allowed"]
    assert validate(make_review(make_pod()), Inventory(), SETTINGS)["response"]["allowed"]
