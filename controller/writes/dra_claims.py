"""The ResourceClaim the controller creates for a DRA pod it places (pure: dicts out).

The webhook admitted the pod with a reference to a claim that does not exist
yet (``Allocation.claim``) and each GPU container naming its request
(``gpu-<n>``). Once the engine has chosen (``controller.planning.draplan``), the claim is
created with:

* one request per container exactly as ``sharing.admission.dra_claims.device_request``
  builds it (DeviceClass, the sharing or profile selector, capacity rounded by
  ``SharePolicy``) for the kind of device the engine chose: a MIG instance of
  its profile, a share of the record's mode, or a whole GPU. The device, not
  the record's mode alone, decides: a shared pod the engine placed on MIG (its
  record's ``migFallback``) asks ``gpupack-mig``. Plus the CEL selectors of the chosen device
  (``PinnedDevice.selectors``): kube-scheduler, which allocates the claim when
  it schedules the pod on the node the pod is pinned to, can then only take
  that device;
* the ``gpupack.io/dra-pinned`` annotation (``sharing.dra.pinned``), so that
  later cycles count the promise before the allocation is written;
* an ``ownerReference`` to the pod (its UID): kube-controller-manager's garbage
  collector deletes the claim with the pod, which frees the device. Not
  ``blockOwnerDeletion``: that would need ``update`` on ``pods/finalizers``, and
  nothing here needs the pod's deletion to wait for the claim's.

:func:`existing_pin` says whether a claim that already exists under that name
is the pod's own (created by an earlier cycle that stopped before the release),
and where it was pinned.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from controller.state.dra_usage import ClaimConflict, own_pin, read_usage
from controller.state.snapshot import Pod
from sharing.api.allocation import Allocation, ContainerAllocation
from sharing.dra import names
from sharing.dra.share_config import claim_config
from sharing.admission.dra_claims import MANAGED_BY, DeviceRequestJSON, device_request
from sharing.dra.pinned import ANNOTATION, Pinned, PinnedDevice
from sharing.dra.share_policy import SharePolicy
from sharing.api.keys import DRA_REQUEUES_ANNOTATION
from sharing.api.fields import as_map as _map
from sharing.api.modes import AllocationMode


class ClaimBuildError(ValueError):
    """The pod's record and the engine's choice do not make a claim (which request lacks what)."""


@dataclass(frozen=True)
class _Shape:
    """A recorded container as ``device_request`` reads it (``sharing.admission.dra_claims.ContainerShape``),
    with the profile of the MIG device chosen for it (None for other devices)."""

    container: ContainerAllocation
    index: int
    profile: str | None

    @property
    def kind(self) -> Literal["containers", "initContainers"]:
        return self.container.kind

    @property
    def milli(self) -> int:
        return self.container.milli

    @property
    def memory_bytes(self) -> int | None:
        return self.container.memory_bytes


def _mode(allocation: Allocation, index: int, device: PinnedDevice) -> AllocationMode:
    """The mode of the request for the chosen ``device`` of container ``index``: its kind says it; a
    device the record does not allow that container (a MIG profile neither recorded nor its
    fallback, a share for a pod not given one) is refused."""
    container = allocation.containers[index]
    if device.kind == "gpu":
        return "whole"
    if device.kind == "shared":
        if allocation.mode not in ("mps", "time-slicing"):
            raise ClaimBuildError(f"request {container.resource!r}: a share was chosen for a pod of mode "
                                  f"{allocation.mode!r}")
        return allocation.mode
    recorded = container.profile if allocation.mode == "mig" else None
    fallback = allocation.mig_fallback[index] if allocation.mig_fallback else None
    if device.profile not in (recorded, fallback):
        raise ClaimBuildError(f"request {container.resource!r}: MIG profile {device.profile!r} was chosen; the record "
                              f"allows {recorded or fallback or 'no MIG instance'}")
    return "mig"


def claim_requests(allocation: Allocation, pinned: Pinned, share: SharePolicy) -> list[DeviceRequestJSON]:
    """One request per recorded container, pinned to its chosen device and asking for that kind of device."""
    chosen = {d.request: d for d in pinned.devices}
    requests: list[DeviceRequestJSON] = []
    for index, container in enumerate(allocation.containers):
        device = chosen.get(container.resource)
        if device is None:
            raise ClaimBuildError(f"request {container.resource!r} of container {container.name!r} has no chosen device")
        mode = _mode(allocation, index, device)
        request = device_request(container.resource, mode, _Shape(container, index, device.profile), share)
        request["exactly"]["selectors"] = [*request["exactly"].get("selectors", []), *device.selectors()]
        requests.append(request)
    return requests


def claim_body(pod: Mapping[str, Any], allocation: Allocation, pinned: Pinned, share: SharePolicy,
               requeues: int = 0) -> dict[str, Any]:
    """The ResourceClaim to create in the pod's namespace (``requeues``: the how-manieth re-creation
    of a stalled promise it is, written when not 0)."""
    meta = _map(pod.get("metadata"))
    name, uid = meta.get("name"), meta.get("uid")
    if not allocation.claim or not isinstance(name, str) or not isinstance(uid, str) or not uid:
        raise ClaimBuildError("the pod has no name, no UID or no claim name in its record")
    return {
        "apiVersion": names.API_VERSION, "kind": "ResourceClaim",
        "metadata": {
            "name": allocation.claim, "namespace": str(meta.get("namespace") or "default"),
            "labels": dict(MANAGED_BY),
            "annotations": {ANNOTATION: pinned.to_annotation(),
                            **({DRA_REQUEUES_ANNOTATION: str(requeues)} if requeues else {})},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid, "controller": True}],
        },
        "spec": {"devices": {"requests": claim_requests(allocation, pinned, share),
                             # A right-sized share's predicted use (sharing.dra.share_config): the kubelet
                             # plugin then sets no SM cap below it. Absent for a pod not right-sized.
                             **({"config": config} if (config := claim_config(allocation)) else {})}},
    }


def existing_pin(claim: Mapping[str, Any], pod_uid: str, pods: Iterable[Pod]) -> Pinned | ClaimConflict:
    """Where an existing claim of the pod's name was pinned, if it is the pod's and its pin is one the
    controller wrote (``drausage.pin_untrusted``, over the cycle's ``pods``); else why it is not usable."""
    (record,) = read_usage([claim], [], pods).claims.values()
    return own_pin(record, pod_uid)
