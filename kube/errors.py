"""A Kubernetes API failure, read one way by every component.

- ``conflict`` (409): the object changed under us (a stale ``resourceVersion``, an
  existing name): read again and retry.
- ``invalid`` (422): the server refused the request as written, including a JSON
  patch whose ``test`` operation failed (the guard the controller puts on pod
  patches): the precondition no longer holds.
- ``not_found`` (404).
"""

from __future__ import annotations

import json

from kubernetes.client.exceptions import ApiException


class KubeError(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(f"Kubernetes API {status}: {message}")

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def invalid(self) -> bool:
        return self.status == 422

    @property
    def not_found(self) -> bool:
        return self.status == 404


def from_api_exception(exc: ApiException) -> KubeError:
    """The :class:`KubeError` of a client exception, with the API's own message when it sent one."""
    body = exc.body.decode() if isinstance(exc.body, bytes) else exc.body
    try:
        message = json.loads(body or "{}").get("message") or exc.reason
    except ValueError:
        message = body or exc.reason
    return KubeError(int(exc.status or 0), str(message))
