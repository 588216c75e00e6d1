"""One reading of a Kubernetes API failure for the controller and the agent (``kube.errors``)."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException

from kube.errors import KubeError, from_api_exception


def api_exception(status: int, body: bytes | str | None, reason: str = "Reason") -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = body  # type: ignore[assignment]  # the client stores the raw bytes
    return exc


@pytest.mark.parametrize(
    ("status", "conflict", "invalid", "not_found"),
    [(409, True, False, False), (422, False, True, False), (404, False, False, True), (500, False, False, False)],
)
def test_status_meanings(status: int, conflict: bool, invalid: bool, not_found: bool) -> None:
    error = KubeError(status, "x")
    assert (error.conflict, error.invalid, error.not_found) == (conflict, invalid, not_found)


def test_the_api_message_is_kept() -> None:
    body = json.dumps({"kind": "Status", "message": 'the object has been modified; please apply your changes'})
    error = from_api_exception(api_exception(409, body.encode()))
    assert error.status == 409 and error.conflict and "has been modified" in str(error)
    assert "Gone" in str(from_api_exception(api_exception(410, None, reason="Gone")))
    assert "not json" in str(from_api_exception(api_exception(500, "not json")))


def test_both_components_share_one_client() -> None:
    from controller.kube import Kube as ControllerKube
    from kube.client import KubeClient
    from node.base.kube import Kube as AgentKube

    assert issubclass(ControllerKube, KubeClient) and issubclass(AgentKube, KubeClient)
    # What they share is not redefined: credentials, events and error translation come from one place.
    for name in ("connect", "event", "close", "to_dict"):
        assert name not in vars(ControllerKube) and name not in vars(AgentKube), name
