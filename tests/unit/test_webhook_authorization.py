"""``POST /authorize``: a node agent may list or watch only its own node's pods; nobody else gets an opinion."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from webhook.app import build_app
from webhook.authorization import decide, review_access
from webhook.inventory_source import InventoryHolder, load_file
from webhook.metrics import Metrics
from webhook.settings import WebhookSettings

ROOT = Path(__file__).resolve().parents[2]
AGENT = "system:serviceaccount:gpupack-system:gpupack-node-agent"


def _spec(node: str | None = "gpu-a", verb: str = "list", selector: Any = "own", user: str = AGENT,
          resource: str = "pods", namespace: str = "") -> dict[str, Any]:
    if selector == "own":
        selector = {"requirements": [{"key": "spec.nodeName", "operator": "In", "values": [node]}]}
    attrs: dict[str, Any] = {"verb": verb, "group": "", "version": "v1", "resource": resource, "namespace": namespace}
    if selector is not None:
        attrs["fieldSelector"] = selector
    spec: dict[str, Any] = {"user": user, "groups": ["system:serviceaccounts"], "resourceAttributes": attrs}
    if node is not None:
        spec["extra"] = {"authentication.kubernetes.io/node-name": [node]}
    return spec


def test_an_agent_may_list_and_watch_its_own_nodes_pods_in_any_namespace() -> None:
    for verb in ("list", "watch"):
        for namespace in ("", "gpu-operator"):
            allowed, reason = decide(_spec(verb=verb, namespace=namespace), AGENT)
            assert allowed, reason


@pytest.mark.parametrize("spec, why", [
    (_spec(selector=None), "no field selector: every pod of the cluster"),
    (_spec(selector={"requirements": [{"key": "spec.nodeName", "operator": "In", "values": ["gpu-b"]}]}),
     "another node's pods"),
    (_spec(selector={"requirements": [{"key": "spec.nodeName", "operator": "In", "values": ["gpu-a", "gpu-b"]}]}),
     "its own and another node's"),
    (_spec(selector={"requirements": [{"key": "spec.nodeName", "operator": "NotIn", "values": ["gpu-b"]}]}),
     "every node but one"),
    (_spec(selector={"requirements": [{"key": "metadata.namespace", "operator": "In", "values": ["x"]}]}),
     "a selector on something else"),
    (_spec(node=None), "a token not bound to a node"),
    (_spec(verb="get"), "get by name cannot be confined to a node"),
    (_spec(verb="delete"), "writes are RBAC's and the admission policy's"),
    (_spec(resource="secrets"), "another resource"),
    (_spec(user="system:serviceaccount:tenant:default"), "another account"),
])
def test_everything_else_gets_no_opinion(spec: dict[str, Any], why: str) -> None:
    allowed, reason = decide(spec, AGENT)
    assert not allowed, why
    assert reason


def test_a_clients_raw_selector_is_read_too() -> None:
    assert decide(_spec(selector={"rawSelector": "spec.nodeName=gpu-a"}), AGENT)[0]
    assert decide(_spec(selector={"rawSelector": "status.phase=Running,spec.nodeName==gpu-a"}), AGENT)[0]
    assert not decide(_spec(selector={"rawSelector": "spec.nodeName!=gpu-a"}), AGENT)[0]
    assert not decide(_spec(selector={"rawSelector": "spec.nodeName=gpu-b"}), AGENT)[0]


def test_the_answer_is_a_subject_access_review() -> None:
    answer = review_access({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                            "spec": _spec()}, AGENT)
    assert answer["kind"] == "SubjectAccessReview" and answer["status"]["allowed"] is True
    broken = review_access({"kind": "AdmissionReview"}, AGENT)
    assert broken["status"]["allowed"] is False and "SubjectAccessReview" in broken["status"]["evaluationError"]


@pytest.fixture(scope="module")
def http() -> TestClient:
    holder = InventoryHolder()
    load_file(holder, ROOT / "examples" / "inventory.yaml")
    return TestClient(build_app(holder, WebhookSettings(max_body_bytes=64 * 1024), Metrics()))


def test_the_route_answers_200_with_a_review(http: TestClient) -> None:
    ok = http.post("/authorize", json={"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                                       "spec": _spec()})
    assert ok.status_code == 200 and ok.json()["status"]["allowed"] is True
    for body in (b"not json", b"[]", b"x" * (70 * 1024)):
        answer = http.post("/authorize", content=body)
        assert answer.status_code == 200
        assert answer.json()["status"]["allowed"] is False and answer.json()["status"]["evaluationError"]
    assert http.get("/authorize").status_code == 405
    assert 'gpupack_webhook_requests_total{endpoint="authorize",outcome="allowed"} 1.0' in http.get("/metrics").text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=12),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=12), c, max_size=4)))
def test_no_body_gets_a_500_or_an_allow_it_should_not(http: TestClient, spec: Any) -> None:
    answer = http.post("/authorize", json={"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                                           "spec": spec})
    assert answer.status_code == 200
    assert answer.json()["status"]["allowed"] is False  # random specs never carry the agent's exact request
