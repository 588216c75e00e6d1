"""The two gRPC services the kubelet calls: plugin registration and the DRA v1 plugin service.

Registration (``pluginregistration.Registration`` on the registration socket):
``GetInfo`` answers type ``DRAPlugin``, the driver name, the DRA socket as the
endpoint, and the service it implements as its supported version:
``v1.DRAPlugin`` (``DRAPluginService`` in ``k8s.io/kubelet/pkg/apis/dra/v1``:
for DRA the kubelet reads the versions as gRPC service names).
``NotifyRegistrationStatus`` is logged and kept (:attr:`RegistrationService.status`).

DRA (``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`` on the DRA socket): every claim
of a call gets an entry in the answer, keyed by its UID; a claim that cannot be
prepared or unprepared gets its ``error`` there and the call itself succeeds, so
one bad claim never fails the others. An unexpected exception is logged with its
traceback and becomes that claim's error too: bad input never crashes the plugin.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from node.draplugin.claims import ClaimError, ClaimRef
from node.draplugin.prepare import ClaimPreparer
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


@dataclass(frozen=True)
class RegistrationStatus:
    registered: bool
    error: str


class RegistrationService(reg_grpc.RegistrationServicer):
    def __init__(self, endpoint: Path) -> None:
        self.endpoint = endpoint
        self._status: RegistrationStatus | None = None
        self._changed = threading.Condition()

    @property
    def status(self) -> RegistrationStatus | None:
        """What the kubelet last said about the registration (None: nothing yet)."""
        with self._changed:
            return self._status

    def GetInfo(self, request: reg.InfoRequest, context: Any) -> reg.PluginInfo:
        return reg.PluginInfo(type=PLUGIN_TYPE, name=DRIVER, endpoint=str(self.endpoint),
                              supported_versions=[DRA_SERVICE_VERSION])

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
