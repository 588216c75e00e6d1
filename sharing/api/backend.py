"""Which backend serves a GPU: the device plugin's extended resources, or gpupack's DRA driver.

A GPU is owned by exactly one backend, chosen per node pool: a node labelled
``gpupack.io/backend=dra`` runs the node agent with ``--backend dra`` and
gpupack's kubelet plugin (it publishes ResourceSlices, docs/dra.md); any other
node, labelled ``device-plugin`` or not labelled, is served by NVIDIA's device
plugin as before. This module is the one reading of that label.

A gpupack pod bound for the DRA pool does not ask for ``nvidia.com/*``
resources: it references one ResourceClaim, :data:`POD_CLAIM` in its
``spec.resourceClaims``, named :func:`pod_claim_name` by the webhook at
admission, and the claim itself is created by the controller when its packing
engine has chosen the node and the devices (docs/dra.md, "Placement").
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Final, Literal, TypeGuard

from sharing.api.keys import BACKEND_LABEL

Backend = Literal["device-plugin", "dra"]
BACKENDS: Final[tuple[Backend, ...]] = ("device-plugin", "dra")
DEFAULT_BACKEND: Final[Backend] = "device-plugin"

POD_CLAIM: Final = "gpupack"
"""The name of gpupack's entry in a pod's ``spec.resourceClaims`` (and in each GPU container's
``resources.claims``)."""
CLAIM_PREFIX: Final = "gpupack-pod-"


def is_backend(value: object) -> TypeGuard[Backend]:
    return value in BACKENDS


def node_backend(labels: Mapping[str, str] | None) -> Backend:
    """The backend of a node, from its labels; a value that names no backend is the default's
    (the webhook and the agent report such a label as a problem; here it must not crash a reader)."""
    value = (labels or {}).get(BACKEND_LABEL)
    return value if is_backend(value) else DEFAULT_BACKEND


def pod_claim_name(admission_uid: str) -> str:
    """The ResourceClaim a DRA pod references, named at admission before the pod has a name
    (``generateName``): a hash of the AdmissionReview's uid, unique per request, so a pod's
    claim name is fixed before the pod exists and never collides with another pod's."""
    digest = hashlib.sha256(admission_uid.encode()).hexdigest()[:16]
    return CLAIM_PREFIX + digest
