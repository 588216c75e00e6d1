"""The shared Kubernetes client edge (``kube.client``): retries, error translation, Events, credentials."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError, ProtocolError

from kube.client import (
    RETRY_DELAYS_S,
    UNREACHABLE,
    KubeClient,
    KubeConfigError,
    api_client,
    call,
    event_body,
)
from kube.errors import KubeError


class Flaky:
    """Fails with ``failures`` in order, then answers ``"ok"``; counts the attempts."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.attempts = 0

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        self.attempts += 1
        if self.failures:
            raise self.failures.pop(0)
        return "ok"


def no_sleep(_seconds: float) -> None:
    pass


@pytest.mark.parametrize("status", [429, 500, 503, 504])
def test_an_idempotent_call_is_retried_after_a_transient_failure(status: int) -> None:
    fn = Flaky(ApiException(status=status, reason="busy"))
    assert call(fn, idempotent=True, sleep=no_sleep) == "ok"
    assert fn.attempts == 2


def test_a_dropped_connection_is_transient_and_reads_as_unreachable() -> None:
    fn = Flaky(ProtocolError("connection reset"))
    assert call(fn, idempotent=True, sleep=no_sleep) == "ok"
    with pytest.raises(KubeError) as caught:
        call(Flaky(MaxRetryError(None, "/api", "refused")))  # type: ignore[arg-type]
    assert caught.value.status == UNREACHABLE and "unreachable" in str(caught.value)


def test_retries_stop_after_the_last_delay() -> None:
    waits: list[float] = []
    fn = Flaky(*[ApiException(status=503, reason="down")] * 10)
    with pytest.raises(KubeError) as caught:
        call(fn, idempotent=True, sleep=waits.append)
    assert caught.value.status == 503
    assert fn.attempts == 1 + len(RETRY_DELAYS_S) and waits == list(RETRY_DELAYS_S)


@pytest.mark.parametrize("status", [400, 403, 404, 409, 422])
def test_an_answer_about_the_request_itself_is_not_retried(status: int) -> None:
    fn = Flaky(ApiException(status=status, reason="no"))
    with pytest.raises(KubeError) as caught:
        call(fn, idempotent=True, sleep=no_sleep)
    assert caught.value.status == status and fn.attempts == 1


def test_a_non_idempotent_call_is_never_retried() -> None:
    # A guarded JSON patch whose answer was lost would read as a failed test on a retry.
    fn = Flaky(ApiException(status=503, reason="down"))
    with pytest.raises(KubeError):
        call(fn, sleep=no_sleep)
    assert fn.attempts == 1


def test_arguments_reach_the_call() -> None:
    seen: dict[str, Any] = {}

    def fn(*args: Any, **kwargs: Any) -> int:
        seen.update(args=args, kwargs=kwargs)
        return 7

    assert call(fn, "a", 2, _content_type="x", idempotent=True) == 7
    assert seen == {"args": ("a", 2), "kwargs": {"_content_type": "x"}}


def test_event_body_for_a_namespaced_and_a_cluster_scoped_object() -> None:
    now = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    pod = event_body({"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "team", "uid": "u"},
                     "Normal", "RightSize", "x" * 5000, "gpupack-controller", now)
    assert pod["metadata"] == {"generateName": "p.", "namespace": "team"}
    assert pod["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "team", "uid": "u"}
    assert len(pod["message"]) == 1024 and pod["source"] == {"component": "gpupack-controller"}
    assert pod["firstTimestamp"] == pod["lastTimestamp"] == "2026-01-02T03:04:05+00:00"
    node = event_body({"apiVersion": "gpupack.io/v1alpha1", "kind": "GPUNode", "name": "n1", "uid": None,
                       "ignored": 1}, "Warning", "R", "m", "gpupack-node-agent", now)
    # Cluster-scoped objects' events go to the default namespace; empty and unknown keys are dropped.
    assert node["metadata"]["namespace"] == "default"
    assert node["involvedObject"] == {"apiVersion": "gpupack.io/v1alpha1", "kind": "GPUNode", "name": "n1"}


def test_event_goes_through_the_client_with_the_components_name() -> None:
    created: list[tuple[str, dict[str, Any]]] = []

    class Core:
        def create_namespaced_event(self, namespace: str, body: dict[str, Any]) -> None:
            created.append((namespace, body))

    class Agent(KubeClient):
        component = "gpupack-node-agent"

    agent = Agent.__new__(Agent)
    agent._core = Core()  # type: ignore[assignment]
    agent.event({"kind": "GPUNode", "name": "n1"}, "Warning", "Reason", "message")
    assert created[0][0] == "default" and created[0][1]["source"]["component"] == "gpupack-node-agent"


def test_missing_credentials_name_where_they_were_looked_for(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    missing = tmp_path / "nope.yaml"
    with pytest.raises(KubeConfigError, match=str(missing)):
        api_client(str(missing))
    garbage = tmp_path / "garbage.yaml"
    garbage.write_text("just a string\n")
    with pytest.raises(KubeConfigError, match="garbage.yaml"):
        api_client(str(garbage))
