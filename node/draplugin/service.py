"""The two gRPC services the kubelet calls: plugin registration and the DRA v1 plugin service.

Registration (``pluginregistration.Registration`` on the registration socket):
``GetInfo`` answers type ``DRAPlugin``, the driver name, the DRA socket as the
endpoint, and the services it implements as its supported versions:
``v1.DRAPlugin`` (``DRAPluginService`` in ``k8s.io/kubelet/pkg/apis/dra/v1``:
for DRA the kubelet reads the versions as gRPC service names) and, when the
plugin streams device health, ``v1.DRAResourceHealth``
(``k8s.io/kubelet/pkg/apis/dra-health/v1``; the kubelet looks for it in this
list, ``pickHealthService`` in its DRA plugin manager).
``NotifyRegistrationStatus`` is logged and kept (:attr:`RegistrationService.status`).

DRA (``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`` on the DRA socket): every claim
of a call gets an entry in the answer, keyed by its UID; a claim that cannot be
prepared or unprepared gets its ``error`` there and the call itself succeeds, so
one bad claim never fails the others. An unexpected exception is logged with its
traceback and becomes that claim's error too: bad input never crashes the plugin.

Health (``v1.DRAResourceHealth`` on the DRA socket): ``NodeWatchResources``
streams the health of every prepared claim's devices (``node.draplugin.health``)
at once and then every ``interval_s``, until the kubelet cancels the stream or
the plugin stops.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import grpc  # type: ignore[import-untyped]

from node.draplugin.claims import ClaimError, ClaimRef
from node.draplugin.health import Health, NodeHealthView, device_health
from node.draplugin.prepare import ClaimPreparer
from node.kubeletapi import dra_health_v1_pb2 as dra_health
from node.kubeletapi import dra_health_v1_pb2_grpc as dra_health_grpc
from node.kubeletapi import dra_v1_pb2 as dra
from node.kubeletapi import dra_v1_pb2_grpc as dra_grpc
from node.kubeletapi import pluginregistration_v1_pb2 as reg
from node.kubeletapi import pluginregistration_v1_pb2_grpc as reg_grpc
from sharing.dra.names import DRIVER

log = logging.getLogger("gpupack.dra-plugin")

PLUGIN_TYPE: Final = "DRAPlugin"
"""``pluginregistration/v1.DRAPlugin``: the plugin type the kubelet's DRA manager handles."""
DRA_SERVICE_VERSION: Final = "v1.DRAPlugin"
"""``dra/v1.DRAPluginService``: what a plugin serving the v1 DRA API lists as its supported version."""
HEALTH_SERVICE_VERSION: Final = "v1.DRAResourceHealth"
"""``dra-health/v1.DRAResourceHealthService``: listed too when the plugin streams device health."""
MAX_HEALTH_STREAMS: Final = 2
"""Health streams open at once. The kubelet keeps one (a second while it replaces it); each holds a
worker thread of the DRA socket, so more would starve prepares."""
_HEALTH: Final[dict[Health, int]] = {"Healthy": dra_health.HEALTHY, "Unhealthy": dra_health.UNHEALTHY,
                                     "Unknown": dra_health.UNKNOWN}


@dataclass(frozen=True)
class RegistrationStatus:
    registered: bool
    error: str


class RegistrationService(reg_grpc.RegistrationServicer):
    def __init__(self, endpoint: Path, health: bool = False) -> None:
        self.endpoint = endpoint
        self.versions = [DRA_SERVICE_VERSION, HEALTH_SERVICE_VERSION] if health else [DRA_SERVICE_VERSION]
        self._status: RegistrationStatus | None = None
        self._changed = threading.Condition()

    @property
    def status(self) -> RegistrationStatus | None:
        """What the kubelet last said about the registration (None: nothing yet)."""
        with self._changed:
            return self._status

    def GetInfo(self, request: reg.InfoRequest, context: Any) -> reg.PluginInfo:
        return reg.PluginInfo(type=PLUGIN_TYPE, name=DRIVER, endpoint=str(self.endpoint),
                              supported_versions=self.versions)

    def NotifyRegistrationStatus(self, request: reg.RegistrationStatus, context: Any) -> reg.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("the kubelet registered the plugin (driver %s, endpoint %s)", DRIVER, self.endpoint)
        else:
            log.error("the kubelet refused to register the plugin: %s", request.error or "(no reason given)")
        with self._changed:
            self._status = RegistrationStatus(request.plugin_registered, request.error)
            self._changed.notify_all()
        return reg.RegistrationStatusResponse()


class DraService(dra_grpc.DRAPluginServicer):
    def __init__(self, preparer: ClaimPreparer) -> None:
        self.preparer = preparer
        self._in_flight = 0
        self._counting = threading.Lock()

    @property
    def in_flight(self) -> int:
        """Calls being answered right now."""
        with self._counting:
            return self._in_flight

    def NodePrepareResources(self, request: dra.NodePrepareResourcesRequest,
                             context: Any) -> dra.NodePrepareResourcesResponse:
        with self._counted():
            return self._prepare(request)

    def NodeUnprepareResources(self, request: dra.NodeUnprepareResourcesRequest,
                               context: Any) -> dra.NodeUnprepareResourcesResponse:
        with self._counted():
            return self._unprepare(request)

    @contextlib.contextmanager
    def _counted(self) -> Iterator[None]:
        with self._counting:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._counting:
                self._in_flight -= 1

    def _prepare(self, request: dra.NodePrepareResourcesRequest) -> dra.NodePrepareResourcesResponse:
        response = dra.NodePrepareResourcesResponse()
        for claim in request.claims:
            ref = ClaimRef(claim.uid, claim.namespace, claim.name)
            entry = response.claims[claim.uid]
            entry.Clear()  # a claim listed twice: answered once, as the last time
            error = _guarded("prepare", ref, lambda: self._prepare_into(ref, entry))
            if error:
                entry.Clear()
                entry.error = error
        return response

    def _unprepare(self, request: dra.NodeUnprepareResourcesRequest) -> dra.NodeUnprepareResourcesResponse:
        response = dra.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            ref = ClaimRef(claim.uid, claim.namespace, claim.name)
            entry = response.claims[claim.uid]
            entry.Clear()
            error = _guarded("unprepare", ref, lambda: self.preparer.unprepare(ref))
            if error:
                entry.error = error
        return response

    def _prepare_into(self, ref: ClaimRef, entry: dra.NodePrepareResourceResponse) -> None:
        for device in self.preparer.prepare(ref):
            added = entry.devices.add(request_names=[device.request], pool_name=device.pool,
                                      device_name=device.device, cdi_device_ids=list(device.cdi_ids))
            if device.share_id is not None:
                added.share_id = device.share_id


class HealthService(dra_health_grpc.DRAResourceHealthServicer):
    """``NodeWatchResources``: the prepared devices' health, now and every ``interval_s``."""

    def __init__(self, preparer: ClaimPreparer, view: Callable[[], NodeHealthView], interval_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.preparer = preparer
        self.view = view
        self.interval_s = interval_s
        self.timeout_s = max(1, round(3 * interval_s))
        """What each device's report tells the kubelet to wait for the next before it reads Unknown:
        three intervals, so one slow look (an API server that answers late) is not a health change."""
        self.clock = clock
        self._closing = False
        self._wakes: set[threading.Event] = set()
        self._lock = threading.Lock()

    def message(self) -> dra_health.NodeWatchResourcesResponse:
        """The complete list, as of now."""
        records = [device for record in self.preparer.records.values() if record.phase == "Prepared"
                   for device in record.devices]
        now = int(self.clock())
        response = dra_health.NodeWatchResourcesResponse()
        if not records:
            return response  # nothing to report: no read of the GPUNode either
        for report in device_health(records, self.view()):
            response.devices.add(device=dra_health.DeviceIdentifier(pool_name=report.pool, device_name=report.device),
                                 health=_HEALTH[report.health], last_updated_time=now,
                                 health_check_timeout_seconds=self.timeout_s, message=report.message)
        return response

    def NodeWatchResources(self, request: dra_health.NodeWatchResourcesRequest,
                           context: Any) -> Iterator[dra_health.NodeWatchResourcesResponse]:
        wake = threading.Event()
        with self._lock:
            if self._closing:
                context.abort(grpc.StatusCode.UNAVAILABLE, "the plugin is stopping")
            if len(self._wakes) >= MAX_HEALTH_STREAMS:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"{MAX_HEALTH_STREAMS} health streams are open already; close one first")
            self._wakes.add(wake)
        context.add_callback(wake.set)  # the kubelet cancelled, or the connection went
        log.info("the kubelet watches device health (every %.0f s)", self.interval_s)
        try:
            while True:
                yield self.message()
                wake.wait(self.interval_s)
                with self._lock:
                    if self._closing or not context.is_active():
                        return
        finally:
            with self._lock:
                self._wakes.discard(wake)

    def close(self) -> None:
        """End every stream (the plugin is stopping) and refuse new ones."""
        with self._lock:
            self._closing = True
            for wake in self._wakes:
                wake.set()


def _guarded(what: str, claim: ClaimRef, action: Callable[[], object]) -> str:
    """Run ``action``; its failure as the claim's error text ("" on success)."""
    try:
        action()
    except ClaimError as exc:
        log.warning("%s of %s failed: %s", what, claim, exc)
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - one claim's bug must not fail the call for the others
        log.exception("%s of %s failed unexpectedly", what, claim)
        return f"internal error in gpupack's DRA plugin during {what}: {type(exc).__name__}: {exc}"
    return ""
