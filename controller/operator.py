"""Wiring: kopf watches wake a planning loop that runs only on the elected leader.

kopf watches pods carrying a ``gpupack.io/allocation`` annotation, GPUNodes
and SharingPolicies; every event just *wakes* the loop (no per-object
handler state, nothing kopf must persist on the objects). The loop waits
``batch_seconds`` after the first wake for more events, then runs one
:meth:`controller.reconcile.Controller.cycle` — if, and only if, this replica
holds the Lease (:mod:`controller.leader`). It also runs every
``resync_seconds`` without events, because idle timers and maintenance windows
expire silently.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import kopf

from controller.kube import Kube
from controller.leader import LeaderElector, LeaseSettings
from controller.metrics import ControllerMetrics
from controller.reconcile import Controller, CycleReport
from controller.settings import ControllerSettings
from kube.backoff import Backoff
from sharing.crd import GROUP, VERSION
from sharing.keys import ALLOCATION_ANNOTATION

log = logging.getLogger("gpupack.controller")


class Loop:
    """The planning loop: wake, batch, elect, cycle."""

    def __init__(self, controller: Controller, elector: LeaderElector, settings: ControllerSettings,
                 on_cycle: Callable[[CycleReport], None] | None = None) -> None:
        self.controller = controller
        self.elector = elector
        self.settings = settings
        self.on_cycle = on_cycle
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.backoff = Backoff(base_s=1.0, max_s=30.0)
        self.thread = threading.Thread(target=self.run, name="gpupack-planner", daemon=True)

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def run(self) -> None:
        renew = max(0.5, self.elector.settings.duration_seconds / 5)
        last_cycle = 0.0
        while not self._stop.is_set():
            woken = self._wake.wait(timeout=renew)
            if self._stop.is_set():
                break
            leader = self.elector.step()
            self.controller.metrics.leader.set(1 if leader else 0)
            due = time.monotonic() - last_cycle >= self.settings.resync_seconds
            if not leader or not (woken or due):
                continue
            if woken and self.settings.batch_seconds > 0:
                self._stop.wait(self.settings.batch_seconds)  # gather the rest of the burst
            self._wake.clear()
            if not self.elector.is_leader():
                continue
            try:
                report = self.controller.cycle()
            except Exception as exc:  # noqa: BLE001 - a cycle bug or an outage must not kill the loop
                self.controller.metrics.reconcile_errors.labels("cycle").inc()
                pause, news = self.backoff.failed(f"{type(exc).__name__}: {exc}")
                if news:  # once per change of state, not once per attempt
                    log.exception("planning cycle failed; retrying with back-off (next in %.1fs)", pause)
                # Back off, but an event (kopf is watching again: the API server answers) ends the pause early.
                self._wake.wait(pause)
                self._wake.set()  # try again after the pause even if nothing changes meanwhile
                continue
            if self.backoff.succeeded():
                log.info("planning cycles work again")
            last_cycle = time.monotonic()
            if self.on_cycle is not None:
                self.on_cycle(report)
        self.elector.release()


def build_registry(loop: Loop) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    def wake(**_: Any) -> None:
        loop.wake()

    kopf.on.event("v1", "pods", annotations={ALLOCATION_ANNOTATION: kopf.PRESENT}, registry=registry)(wake)
    kopf.on.event(GROUP, VERSION, "gpunodes", registry=registry)(wake)
    kopf.on.event(GROUP, VERSION, "sharingpolicies", registry=registry)(wake)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A custom registry does not inherit kopf's default login handlers.
        return kopf.login_with_kubeconfig(**kwargs) or kopf.login_with_service_account(**kwargs)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.peering.standalone = True  # leader election is ours (a Lease), not kopf's peering CRD
        settings.posting.enabled = False  # events are posted by the controller where they mean something
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 30

    return registry


def run(settings: ControllerSettings, kubeconfig: str | None) -> int:
    """Run until interrupted: metrics server, planning loop, kopf watches (main thread)."""
    import os

    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig  # kopf's own login reads it
    kube = Kube.connect(kubeconfig)
    metrics = ControllerMetrics()
    if settings.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(settings.metrics_port, registry=metrics.registry)
    lease = LeaseSettings(settings.lease_namespace, settings.lease_name, settings.lease_seconds,
                          renew_deadline_seconds=settings.lease_seconds * 2 / 3)
    elector = LeaderElector(kube, settings.identity, lease)
    loop = Loop(Controller(kube, settings, metrics), elector, settings)
    loop.thread.start()
    registry = build_registry(loop)
    try:
        kopf.run(registry=registry, standalone=True, clusterwide=True)
    finally:
        loop.stop()
        loop.thread.join(timeout=10)
        kube.close()
    return 0
