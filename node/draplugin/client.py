"""The kubelet's side of the plugin API, for tests and ``gpupack dra-plugin call`` (there is no
kubelet on a development machine): the same generated stubs and messages the kubelet's own client
sends, over the plugin's unix sockets.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]

from node.draplugin.claims import ClaimRef
from node.kubeletapi import dra_health_v1_pb2 as dra_health
from node.kubeletapi import dra_health_v1_pb2_grpc as dra_health_grpc
from node.kubeletapi import dra_v1_pb2 as dra
from node.kubeletapi import dra_v1_pb2_grpc as dra_grpc
from node.kubeletapi import pluginregistration_v1_pb2 as reg
from node.kubeletapi import pluginregistration_v1_pb2_grpc as reg_grpc


class KubeletClient:
    """Calls one socket; ``timeout_s`` bounds each call (the kubelet's own default is 45 s)."""

    def __init__(self, socket: Path, timeout_s: float = 45.0) -> None:
        self._channel: Any = grpc.insecure_channel(f"unix://{socket}")
        self.timeout_s = timeout_s

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> KubeletClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def info(self) -> reg.PluginInfo:
        return reg_grpc.RegistrationStub(self._channel).GetInfo(reg.InfoRequest(), timeout=self.timeout_s)

    def notify(self, registered: bool, error: str = "") -> None:
        reg_grpc.RegistrationStub(self._channel).NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=registered, error=error), timeout=self.timeout_s)

    def prepare(self, claims: Iterable[ClaimRef]) -> dra.NodePrepareResourcesResponse:
        request = dra.NodePrepareResourcesRequest(claims=[_claim(c) for c in claims])
        return dra_grpc.DRAPluginStub(self._channel).NodePrepareResources(request, timeout=self.timeout_s)

    def unprepare(self, claims: Iterable[ClaimRef]) -> dra.NodeUnprepareResourcesResponse:
        request = dra.NodeUnprepareResourcesRequest(claims=[_claim(c) for c in claims])
        return dra_grpc.DRAPluginStub(self._channel).NodeUnprepareResources(request, timeout=self.timeout_s)


    def watch_health(self, messages: int) -> Iterator[dra_health.NodeWatchResourcesResponse]:
        """The first ``messages`` messages of a health stream, as they come; the stream is cancelled
        after the last (or when the caller stops iterating). ``timeout_s`` bounds the whole watch."""
        stream = dra_health_grpc.DRAResourceHealthStub(self._channel).NodeWatchResources(
            dra_health.NodeWatchResourcesRequest(), timeout=self.timeout_s)
        try:
            for count, message in enumerate(stream, start=1):
                yield message
                if count >= messages:
                    return
        finally:
            stream.cancel()


def _claim(ref: ClaimRef) -> dra.Claim:
    return dra.Claim(namespace=ref.namespace, uid=ref.uid, name=ref.name)


def prepare_answer_json(response: dra.NodePrepareResourcesResponse) -> dict[str, Any]:
    """The answer as plain JSON (claim UID -> devices or error), for people and scripts."""
    out: dict[str, Any] = {}
    for uid, entry in sorted(response.claims.items()):
        if entry.error:
            out[uid] = {"error": entry.error}
            continue
        devices = []
        for device in entry.devices:
            item: dict[str, Any] = {"requestNames": list(device.request_names), "pool": device.pool_name,
                                    "device": device.device_name, "cdiDeviceIDs": list(device.cdi_device_ids)}
            if device.HasField("share_id"):
                item["shareID"] = device.share_id
            devices.append(item)
        out[uid] = {"devices": devices}
    return out


def unprepare_answer_json(response: dra.NodeUnprepareResourcesResponse) -> dict[str, Any]:
    return {uid: ({"error": entry.error} if entry.error else {}) for uid, entry in sorted(response.claims.items())}


def health_answer_json(response: dra_health.NodeWatchResourcesResponse) -> list[dict[str, Any]]:
    """One health message as plain JSON: a list of devices with health, message and timings."""
    return [{"pool": d.device.pool_name, "device": d.device.device_name,
             "health": dra_health.HealthStatus.Name(d.health), "message": d.message,
             "lastUpdatedTime": d.last_updated_time, "healthCheckTimeoutSeconds": d.health_check_timeout_seconds}
            for d in response.devices]
