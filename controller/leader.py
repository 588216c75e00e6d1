"""Leader election on a ``coordination.k8s.io/v1`` Lease, so two replicas never both act.

The algorithm is client-go's, in miniature:

* the holder renews ``spec.renewTime`` every ``retry`` seconds by a
  compare-and-swap replace (the Lease's ``resourceVersion``); a failed or
  conflicting renew is not retried blindly;
* a candidate takes over only after it has seen the *same* Lease record (same
  holder and renew time) unchanged for a full ``duration`` by its **own** clock,
  so clock skew between machines cannot make two holders;
* the holder stops acting as soon as its last successful renew is older than
  ``renew_deadline`` (< ``duration``): by then a candidate may be close to
  taking over, and the old leader must already be quiet.

The Kubernetes calls go through a narrow protocol (``LeaseApi``), implemented by
:class:`controller.kube.Kube` and by an in-memory fake in the tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kube.times import format_micro_time


class LeaseApi(Protocol):
    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]: ...
    def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True)
class LeaseSettings:
    namespace: str = "gpupack-system"
    name: str = "gpupack-controller"
    duration_seconds: float = 15.0
    """How long a silent holder keeps the lease (client-go's default)."""
    renew_deadline_seconds: float = 10.0
    """The holder stops acting when it has not renewed for this long (< duration)."""


class LeaderElector:
    """Call :meth:`step` every second or two; :meth:`is_leader` says whether to act now."""

    def __init__(
        self, api: LeaseApi, identity: str, settings: LeaseSettings = LeaseSettings(),
        clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.identity = identity
        self.settings = settings
        self.clock = clock
        self.wall = wall
        self._renewed_at: float | None = None
        self._observed: tuple[str, str] | None = None
        self._observed_at = 0.0
        self.transitions = 0

    def is_leader(self) -> bool:
        return self._renewed_at is not None and self.clock() - self._renewed_at < self.settings.renew_deadline_seconds

    def _body(self, current: Mapping[str, Any] | None, transitions: int) -> dict[str, Any]:
        now = format_micro_time(self.wall())
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.settings.duration_seconds),
            "renewTime": now,
            "acquireTime": now,
            "leaseTransitions": transitions,
        }
        meta: dict[str, Any] = {"name": self.settings.name, "namespace": self.settings.namespace}
        if current is not None:
            old = current.get("spec") or {}
            if old.get("holderIdentity") == self.identity and old.get("acquireTime"):
                spec["acquireTime"] = old["acquireTime"]
            meta["resourceVersion"] = (current.get("metadata") or {}).get("resourceVersion")
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    def step(self) -> bool:
        """Acquire or renew if possible; returns :meth:`is_leader` afterwards. API errors count as a failed renew."""
        s = self.settings
        try:
            current = self.api.get_lease(s.namespace, s.name)
            if current is None:
                self.api.create_lease(s.namespace, self._body(None, 0))
                self._renewed_at = self.clock()
                return True
            spec = current.get("spec") or {}
            holder = str(spec.get("holderIdentity") or "")
            record = (holder, str(spec.get("renewTime") or ""))
            if record != self._observed:
                self._observed, self._observed_at = record, self.clock()
            transitions = int(spec.get("leaseTransitions") or 0)
            if holder == self.identity:
                if not self.is_leader() and self._renewed_at is None:
                    # A previous incarnation of us held it: take it back as a transition.
                    transitions += 1
                self.api.replace_lease(s.namespace, s.name, self._body(current, transitions))
                self._renewed_at = self.clock()
                return True
            duration = float(spec.get("leaseDurationSeconds") or s.duration_seconds)
            if holder and self.clock() - self._observed_at < duration:
                self._renewed_at = None
                return False
            self.api.replace_lease(s.namespace, s.name, self._body(current, transitions + 1))
            self._renewed_at = self.clock()
            self.transitions += 1
            return True
        except Exception:  # noqa: BLE001 - any failure to renew means: do not act
            return self.is_leader()

    def release(self) -> None:
        """Give the lease up on shutdown so a standby takes over at once."""
        if not self.is_leader():
            return
        s = self.settings
        try:
            current = self.api.get_lease(s.namespace, s.name)
            if current is not None and (current.get("spec") or {}).get("holderIdentity") == self.identity:
                body = self._body(current, int((current.get("spec") or {}).get("leaseTransitions") or 0))
                body["spec"]["holderIdentity"] = ""
                self.api.replace_lease(s.namespace, s.name, body)
        except Exception:  # noqa: BLE001 - best effort; the lease expires anyway
            pass
        self._renewed_at = None
