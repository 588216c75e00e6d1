"""The opaque configuration a ResourceClaim carries for a right-sized share: written and read here.

A container the webhook right-sized from its workload's recommendation (``predictedMilli`` in the
pod's allocation record, ``sharing.api.allocation``) asks its claim for its *accounted* milli (what
kube-scheduler counts against the device's ``gpu.gpupack.io/milli`` capacity, less than its
predicted use where the namespace over-commits compute), and its MPS share gets no SM cap: a
recommendation's milli is a duty cycle, not a share of the SMs (docs/right-sizing.md). The kubelet
plugin sets a share's limits from its allocation only (``node.draplugin.mps``), so the claim must
say which of its requests are right-sized. It says so in ``spec.devices.config``, the DRA API's place
for a driver's own parameters, which kube-scheduler copies into ``status.allocation.devices.config``
(``source: FromClaim``) for the requests it allocated:

    {"requests": ["gpu-0"], "opaque": {"driver": "gpu.gpupack.io", "parameters":
      {"apiVersion": "gpu.gpupack.io/v1alpha1", "kind": "RightSizedShare", "predictedMilli": 120}}}

One entry per right-sized container. :func:`claim_config` builds the entries from the pod's
allocation record (for the claim the controller creates); :func:`predicted_by_request` reads them
back from a claim's allocation (for the kubelet plugin, which honours them only on a claim the
controller created, ``node.draplugin.claims``: a tenant's claim must not lift its own SM cap).
Entries of other drivers, and of other kinds of ours, are not this module's business and are left
alone; one of ours that does not read is an error (a share must not silently get a limit it was not
given).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal, TypedDict

from sharing.api.allocation import Allocation
from sharing.dra.names import DRIVER
from sharing.dra.results import ResultError

PARAMETERS_API_VERSION: Final = "gpu.gpupack.io/v1alpha1"
RIGHT_SIZED_KIND: Final = "RightSizedShare"


class RightSizedParametersJSON(TypedDict):
    apiVersion: str
    kind: Literal["RightSizedShare"]
    predictedMilli: int


class OpaqueConfigJSON(TypedDict):
    driver: str
    parameters: RightSizedParametersJSON


class DeviceClaimConfigJSON(TypedDict):
    """One ``spec.devices.config[]`` entry of a ``resource.k8s.io/v1`` ResourceClaim."""

    requests: list[str]
    opaque: OpaqueConfigJSON


def claim_config(allocation: Allocation) -> list[DeviceClaimConfigJSON]:
    """The ``spec.devices.config`` entries of the claim of a pod recorded as ``allocation``: one per
    right-sized container (its request, ``ContainerAllocation.resource``), none for a pod that was
    not right-sized (module docstring)."""
    return [{"requests": [c.resource], "opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": PARAMETERS_API_VERSION, "kind": RIGHT_SIZED_KIND, "predictedMilli": c.predicted_milli}}}
            for c in allocation.containers if c.predicted_milli is not None]


def predicted_by_request(allocation: object, where: str) -> dict[str, int]:
    """Per request name, the predicted milli the right-sized entries of a claim's ``status.allocation``
    (``allocation``; ``where`` names it in errors) give it; :class:`~sharing.dra.results.ResultError`
    naming a malformed entry of ours. An entry without ``requests`` applies to every request
    (``"*"`` in the answer), as the DRA API reads it."""
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    entries = devices.get("config") if isinstance(devices, Mapping) else None
    if entries is None:
        return {}
    if not isinstance(entries, list):
        raise ResultError(f"{where}.devices.config is not a list")
    found: dict[str, int] = {}
    for i, entry in enumerate(entries):
        at = f"{where}.devices.config[{i}]"
        opaque = entry.get("opaque") if isinstance(entry, Mapping) else None
        if not isinstance(opaque, Mapping) or opaque.get("driver") != DRIVER:
            continue
        parameters = opaque.get("parameters")
        if not isinstance(parameters, Mapping) or parameters.get("kind") != RIGHT_SIZED_KIND:
            continue
        if parameters.get("apiVersion") != PARAMETERS_API_VERSION:
            raise ResultError(f"{at}.opaque.parameters.apiVersion {parameters.get('apiVersion')!r} is not "
                              f"{PARAMETERS_API_VERSION!r}")
        milli = parameters.get("predictedMilli")
        if not isinstance(milli, int) or isinstance(milli, bool) or not 1 <= milli <= 1000:
            raise ResultError(f"{at}.opaque.parameters.predictedMilli {milli!r} is not 1..1000")
        requests = entry.get("requests") or ["*"]
        if not isinstance(requests, list) or not all(isinstance(r, str) and r for r in requests):
            raise ResultError(f"{at}.requests is not a list of request names")
        for request in requests:
            found[request] = milli
    return found


__all__ = ["PARAMETERS_API_VERSION", "RIGHT_SIZED_KIND", "DeviceClaimConfigJSON", "claim_config",
           "predicted_by_request"]
