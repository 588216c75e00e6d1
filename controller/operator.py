"""Wiring: watch caches wake a planning loop that runs only on the elected leader.

The controller's watch caches (:mod:`controller.watch_caches`: one list-then-watch
informer per kind it reads) are its only watches: a change that matters
*wakes* the loop (no per-object handler state, nothing persisted on the
objects). The loop waits ``batch_seconds`` after the first wake for more
changes, and at least ``min_cycle_seconds`` after the previous cycle ended, then
runs one :meth:`controller.reconcile.Controller.cycle` — if, and only if, this
replica holds the Lease (:mod:`controller.leader`). A burst of changes is
therefore one cycle, and a cluster where nothing changes costs no cycle but the
one every ``resync_seconds`` (idle timers and maintenance windows expire
silently).

The caches start when the replica first leads, and the first cycle waits for
their first lists (``cache_sync_seconds`` at most; a cache not listed by then is
read by a direct list meanwhile). Once started they keep running: a replica that
lost the lease and wins it again plans at once on an up-to-date copy.

kopf hosts the process (ARCHITECTURE.md): it logs in, handles SIGTERM/SIGINT
and watches SharingPolicies, whose events wake the loop too. It no longer
watches pods or GPUNodes: that was a second watch of every pod of the cluster
beside the caches' (kopf filtered by annotation on the client side), and every
GPUNode heartbeat woke the loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import kopf

from controller.watch_caches import CachedKube, ClusterCaches
from controller.leader import LeaderElector, LeaseSettings
from controller.metrics import ControllerMetrics
from controller.reconcile import Controller, CycleReport
from controller.recommending import RecommenderCycle, RecommenderLoop
from controller.settings import ControllerSettings
from kube.backoff import Backoff
from sharing.api.crd import GROUP, VERSION

log = logging.getLogger("gpupack.controller")


class Loop:
    """The planning loop: wake, batch, elect, cycle."""

    def __init__(self, controller: Controller, elector: LeaderElector, settings: ControllerSettings,
                 on_cycle: Callable[[CycleReport], None] | None = None, caches: ClusterCaches | None = None) -> None:
        self.controller = controller
        self.elector = elector
        self.settings = settings
        self.on_cycle = on_cycle
        self.caches = caches
        """Started on first leadership; their changes wake the loop (None: only ``wake`` does)."""
        if caches is not None:
            caches.on_change = lambda kind: self.wake()
        self.cycles = 0
        self.skipped = 0
        """Wake-ups and renewals that ran no cycle: nothing changed and no resync was due."""
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.backoff = Backoff(base_s=1.0, max_s=30.0)
        self.thread = threading.Thread(target=self.run, name="gpupack-planner", daemon=True)

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _start_caches(self, renew: float) -> None:
        """Start the caches (first leadership) and wait for their first lists, renewing the lease meanwhile."""
        if self.caches is None or self.caches.started:
            return
        began = time.monotonic()
        deadline = began + self.settings.cache_sync_seconds
        self.caches.start()
        while True:
            missing = self.caches.wait_synced(max(0.0, min(renew, deadline - time.monotonic())))
            if not missing or time.monotonic() >= deadline or self._stop.is_set() or not self.elector.step():
                break
        if missing:
            log.warning("watch caches of %s not listed after %.0f s; reading them by direct lists until they are",
                        ", ".join(missing), self.settings.cache_sync_seconds)
        else:
            log.info("watch caches listed in %.1f s: %s", time.monotonic() - began, ", ".join(
                f"{len(i)} {kind}" for kind, i in self.caches.informers.items() if kind in self.caches.started))

    def run(self) -> None:
        renew = max(0.5, self.elector.settings.duration_seconds / 5)
        last_cycle = float("-inf")
        while not self._stop.is_set():
            woken = self._wake.wait(timeout=renew)
            if self._stop.is_set():
                break
            leader = self.elector.step()
            self.controller.metrics.leader.set(1 if leader else 0)
            if leader:
                self._start_caches(renew)
            due = time.monotonic() - last_cycle >= self.settings.resync_seconds
            if not leader or not (woken or due):
                if leader:
                    self.skipped += 1
                continue
            if woken and self.settings.batch_seconds > 0:
                self._stop.wait(self.settings.batch_seconds)  # gather the rest of the burst
            rest = self.settings.min_cycle_seconds - (time.monotonic() - last_cycle)
            if rest > 0:
                self._stop.wait(rest)  # at most one cycle per min_cycle_seconds, however busy the cluster
            self._wake.clear()
            if not self.elector.is_leader():
                continue
            self.controller.metrics.cycle_triggers.labels("change" if woken else "resync").inc()
            try:
                report = self.controller.cycle()
            except Exception as exc:  # noqa: BLE001 - a cycle bug or an outage must not kill the loop
                self.controller.metrics.reconcile_errors.labels("cycle").inc()
                pause, news = self.backoff.failed(f"{type(exc).__name__}: {exc}")
                if news:  # once per change of state, not once per attempt
                    log.exception("planning cycle failed; retrying with back-off (next in %.1fs)", pause)
                # Back off, but a change in the caches (the API server answers again) ends the pause early.
                self._wake.wait(pause)
                self._wake.set()  # try again after the pause even if nothing changes meanwhile
                continue
            if self.backoff.succeeded():
                log.info("planning cycles work again")
            last_cycle = time.monotonic()
            self.cycles += 1
            if any(w.deferred for w in report.plan.waiting):
                self._wake.set()  # pods left to the next cycle: run it (after min_cycle_seconds) unprompted
            self._note_caches()
            if self.on_cycle is not None:
                self.on_cycle(report)
        self.elector.release()

    def _note_caches(self) -> None:
        if self.caches is None:
            return
        for kind, informer in self.caches.informers.items():
            if kind in self.caches.started:
                self.controller.metrics.cached.labels(kind).set(len(informer))
                self.controller.metrics.rejected.labels(kind).set(len(informer.rejected))


def build_registry(loop: Loop) -> kopf.OperatorRegistry:
    """kopf's handlers: SharingPolicy events wake the loop; login and settings for a standalone operator."""
    registry = kopf.OperatorRegistry()

    def wake(**_: Any) -> None:
        loop.wake()

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
    """Run until interrupted: metrics server, watch caches, planning loop (its thread), kopf (main thread)."""
    import os

    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig  # kopf's own login reads it
    kube = CachedKube.connect(kubeconfig)
    metrics = ControllerMetrics()
    if settings.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(settings.metrics_port, registry=metrics.registry)
    lease = LeaseSettings(settings.lease_namespace, settings.lease_name, settings.lease_seconds,
                          renew_deadline_seconds=settings.lease_seconds * 2 / 3)
    elector = LeaderElector(kube, settings.identity, lease)
    loop = Loop(Controller(kube, settings, metrics), elector, settings, caches=kube.caches)
    loop.thread.start()
    # The recommender runs on its own interval, on the leader, reading the planning loop's caches.
    recommender = RecommenderLoop(RecommenderCycle(kube, settings, metrics), elector.is_leader)
    if settings.recommend:
        recommender.thread.start()
    try:
        kopf.run(registry=build_registry(loop), standalone=True, clusterwide=True)
    finally:
        recommender.stop()
        loop.stop()
        loop.thread.join(timeout=5)  # a cycle in progress finishes, then the Lease is given up
        # Not waited for: closing a watch another thread is reading can block until the stream
        # next speaks (minutes on a quiet kind); the informers' threads are daemons anyway.
        threading.Thread(target=kube.caches.stop, name="caches-stop", daemon=True).start()
    return 0
