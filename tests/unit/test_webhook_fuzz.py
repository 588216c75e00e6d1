"""Fuzzing the HTTP app in process: whatever the body, the answer is HTTP 200 and a
well-formed AdmissionReview with the request's uid, never a 500 or a lost field."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from sharing.admission.patch import apply_patch
from webhook.app import build_app
from webhook.inventory_source import InventoryHolder, load_file
from webhook.metrics import Metrics
from webhook.settings import WebhookSettings
from gpupack.testing.admission_reviews import gpu_container, make_pod, make_review

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def client() -> TestClient:
    holder = InventoryHolder()
    load_file(holder, ROOT / "examples" / "inventory.yaml")
    app = build_app(holder, WebhookSettings(max_body_bytes=LIMIT), Metrics())
    return TestClient(app)


def well_formed(http: Any, uid: str | None) -> dict[str, Any]:
    assert http.status_code == 200, http.text
    review = http.json()
    assert review["apiVersion"] == "admission.k8s.io/v1" and review["kind"] == "AdmissionReview"
    response = review["response"]
    assert isinstance(response["allowed"], bool)
    if uid is not None:
        assert response["uid"] == uid
    if not response["allowed"]:
        assert response["status"]["message"]
    return response


def check_pod_answer(response: dict[str, Any], pod: Any) -> None:
    if response["allowed"] and "patch" in response:
        out = apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
        for key in pod:
            assert key in out
        for key, value in pod.get("spec", {}).items():
            if key not in ("containers", "initContainers", "affinity", "schedulingGates"):
                assert out["spec"][key] == value


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
quantities = st.one_of(
    st.sampled_from(["0.5", "1e3", "250m", "250", "1k", "-1", "1001", "", "Gi", "20Gi", "1e309", "NaN", "∞", "２５０",
                     "1E", "1Ei", "8Ei", "1.5E", "1P", "2E3"]),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(),
    st.text(max_size=12),
    json_values,
)
names = st.text(min_size=0, max_size=40)  # unicode included


@given(body=st.binary(max_size=2048))
@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_bytes(client: TestClient, body: bytes) -> None:
    well_formed(client.post("/mutate", content=body), None)
    well_formed(client.post("/validate", content=body), None)


@given(value=json_values)
@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_json(client: TestClient, value: Any) -> None:
    well_formed(client.post("/mutate", content=json.dumps(value, ensure_ascii=False).encode()), None)


@given(
    milli=quantities,
    memory=st.one_of(st.none(), quantities),
    name=names,
    container=names,
    mode=st.one_of(st.none(), st.sampled_from(["auto", "mig", "mps", "time-slicing", "MIG", ""]), st.text(max_size=8)),
    uid=st.text(min_size=1, max_size=40).filter(lambda s: '"' not in s and "\\" not in s),
)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_odd_quantities_and_unicode(
    client: TestClient, milli: Any, memory: Any, name: str, container: str, mode: str | None, uid: str
) -> None:
    pod = make_pod(gpu_container(container, milli, memory), name=name, mode=mode)
    # The stdlib writes inf/nan as bare Infinity/NaN (not JSON): the server must
    # still answer, with the uid read from the unparsable body.
    body = json.dumps(make_review(pod, uid=uid), ensure_ascii=False).encode()
    response = well_formed(client.post("/mutate", content=body), uid)
    check_pod_answer(response, pod)


@pytest.mark.parametrize(("milli", "memory"), [("1E", None), ("250", "1Ei"), ("250", "1E"), ("1Ei", "8Ei")])
def test_exa_quantities_are_refused_with_a_reason(client: TestClient, milli: str, memory: str | None) -> None:
    """Exa suffixes used to be read as exponents and crash the parser (an internal error per request)."""
    pod = make_pod(gpu_container("c", milli, memory))
    response = well_formed(client.post("/mutate", json=make_review(pod, uid="exa")), "exa")
    assert not response["allowed"]
    assert "internal error" not in response["status"]["message"]
    assert "container 'c'" in response["status"]["message"]  # a specific reason, naming the container


@given(
    drop=st.sets(st.sampled_from(["uid", "kind", "object", "operation", "namespace", "resource"])),
    api_version=st.sampled_from(["admission.k8s.io/v1", "admission.k8s.io/v1beta1", "v1", None]),
    kind=st.sampled_from(["AdmissionReview", "Pod", None]),
    obj=st.one_of(st.none(), json_values),
)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_damaged_envelopes(client: TestClient, drop: set[str], api_version: Any, kind: Any, obj: Any) -> None:
    review = make_review(make_pod(gpu_container()), uid="fixed-uid")
    review["apiVersion"], review["kind"] = api_version, kind
    if obj is not None:
        review["request"]["object"] = obj
    for field in drop:
        review["request"].pop(field, None)
    expected_uid = "" if "uid" in drop else "fixed-uid"
    body = json.dumps(review, ensure_ascii=False).encode()  # may hold Infinity/NaN: not JSON
    response = well_formed(client.post("/mutate", content=body), expected_uid)
    if api_version != "admission.k8s.io/v1" or kind != "AdmissionReview" or "uid" in drop:
        assert not response["allowed"]


def test_body_over_the_limit_refused_unread_with_uid(client: TestClient) -> None:
    pod = make_pod(gpu_container(), annotations={"big": "x" * (LIMIT + 1)})
    body = json.dumps(make_review(pod, uid="big-one")).encode()
    response = well_formed(client.post("/mutate", content=body), "big-one")
    assert not response["allowed"] and str(LIMIT) in response["status"]["message"]


def test_body_over_the_limit_without_content_length(client: TestClient) -> None:
    def chunks():  # type: ignore[no-untyped-def]
        yield b'{"apiVersion":"admission.k8s.io/v1","request":{"uid":"streamed","x":"'
        for _ in range(LIMIT // 1024 + 2):
            yield b"y" * 1024
        yield b'"}}'

    response = well_formed(client.post("/mutate", content=chunks()), "streamed")
    assert not response["allowed"]


def test_health_ready_metrics(client: TestClient) -> None:
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").text == "ready"
    client.post("/mutate", json=make_review(make_pod(gpu_container("c", "0"))))
    client.post("/mutate", json=make_review(make_pod(gpu_container("c", "100"))))
    text = client.get("/metrics").text
    assert 'gpupack_webhook_denials_total{reason="MilliOutOfRange"}' in text
    # Every pod waits at the gate for the packing engine's choice (placement: engine).
    assert 'gpupack_webhook_decisions_total{gated="true",mode="mig"}' in text
    assert "gpupack_webhook_request_duration_seconds_bucket" in text
    assert "gpupack_webhook_inventory_nodes 3.0" in text


def test_not_ready_until_synced() -> None:
    holder = InventoryHolder()
    app = build_app(holder, WebhookSettings(), Metrics())
    with TestClient(app) as c:
        assert c.get("/readyz").status_code == 503
        holder.replace([], synced=True)
        assert c.get("/readyz").status_code == 200


def test_wrong_method_is_not_a_500(client: TestClient) -> None:
    assert client.get("/mutate").status_code == 405


def test_handler_failure_is_still_an_admission_review(monkeypatch: pytest.MonkeyPatch) -> None:
    import webhook.app as app_module

    def broken(_: Any) -> bytes:
        raise RuntimeError("encoder bug")

    holder = InventoryHolder()
    holder.replace([], synced=True)
    monkeypatch.setattr(app_module, "dumps", broken)
    with TestClient(build_app(holder, WebhookSettings(), Metrics())) as c:
        response = well_formed(c.post("/mutate", json=make_review(make_pod())), "")
    assert not response["allowed"] and "internal error" in response["status"]["message"]


def test_stdlib_json_fallback_survives_lone_surrogates(monkeypatch: pytest.MonkeyPatch) -> None:
    import webhook.jsonio as jsonio

    monkeypatch.setattr(jsonio, "_orjson", None)
    review = jsonio.loads(b'{"a": "\\ud800"}')
    assert json.loads(jsonio.dumps(review)) == review


FORGED = json.dumps({"version": "v1", "mode": "mig", "gated": True, "policy": "p", "reason": "r", "containers": [
    {"name": "main", "kind": "containers", "milli": 1000, "resource": "nvidia.com/mig-7g.80gb", "profile": "7g.80gb"}]})


@pytest.mark.parametrize(("annotations", "gates"), [
    ({"gpupack.io/allocation": FORGED}, None),  # claims a 7g.80gb the pod does not request
    ({"gpupack.io/allocation": "{not json"}, None),
    ({}, [{"name": "gpupack.io/capacity"}]),  # gpupack's gate without its record
    ({"gpupack.io/allocation": FORGED}, [{"name": "gpupack.io/capacity"}]),
])
def test_hand_written_gpupack_marks_are_refused(
    client: TestClient, annotations: dict[str, str], gates: list[dict[str, str]] | None
) -> None:
    pod = make_pod({"name": "main", "image": "example.com/app:1"}, annotations=annotations)
    if gates is not None:
        pod["spec"]["schedulingGates"] = gates
    response = well_formed(client.post("/mutate", json=make_review(pod, uid="forged")), "forged")
    assert not response["allowed"]
    assert response["status"]["details"]["causes"][0]["reason"] == "ForgedAllocation"


def test_a_record_that_matches_the_pod_passes_as_the_webhooks_own_reinvocation(client: TestClient) -> None:
    first = well_formed(client.post("/mutate", json=make_review(make_pod(gpu_container("main", "250")), uid="a")), "a")
    mutated = apply_patch(make_pod(gpu_container("main", "250")), json.loads(base64.b64decode(first["patch"])))
    again = well_formed(client.post("/mutate", json=make_review(mutated, uid="b")), "b")
    assert again["allowed"] and "patch" not in again
