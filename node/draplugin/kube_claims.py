"""``KubeClaimSource``: the plugin's one call to the Kubernetes API, reading a ResourceClaim.

The plugin needs ``get`` on ``resourceclaims.resource.k8s.io`` (all namespaces)
and nothing else. A claim that does not exist is a per-claim error; any other
API failure too (the kubelet calls again), after :func:`kube.client.call`'s
retries of transient failures.
"""

from __future__ import annotations

from typing import Any

from kube import safejson
from kube.client import KubeClient, call
from kube.errors import KubeError
from node.draplugin.claims import ClaimError, ClaimRef, allocation_from_claim
from sharing.dra.results import AllocatedDevice

GROUP = "resource.k8s.io"
VERSION = "v1"
PLURAL = "resourceclaims"


class KubeClaimSource(KubeClient):
    component = "gpupack-dra-plugin"

    def get(self, claim: ClaimRef) -> tuple[AllocatedDevice, ...]:
        try:
            # Raw, decoded by kube.safejson: a claim whose opaque parameters nest thousands deep
            # is a per-claim error from the typed reader, not a RecursionError out of the client.
            out: Any = call(self._custom.get_namespaced_custom_object, GROUP, VERSION, claim.namespace, PLURAL,
                            claim.name, idempotent=True, _preload_content=False)
        except KubeError as exc:
            if exc.not_found:
                raise ClaimError(f"{claim} does not exist (deleted before it was prepared?)") from None
            raise ClaimError(f"cannot read {claim}: {exc}") from None
        try:
            obj, _ = safejson.loads(out.data)
        except ValueError as exc:
            raise ClaimError(f"cannot read {claim}: the API server's answer is not JSON ({exc})") from None
        return allocation_from_claim(obj, claim)
