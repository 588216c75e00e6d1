"""Which node pool a gpupack pod goes to: the device plugin's or the DRA driver's.

A GPU is served by one backend, chosen per node pool (``sharing.api.backend``), so a
pod must be decided for one pool before anything else: the pool fixes the rules
of the decision and the shape of the patch (docs/dra-pods.md). The first that
says, wins:

1. the pod's label ``gpupack.io/backend``;
2. its namespace's label of the same key (namespace labels come with the
   inventory, as SharingPolicy namespace selectors need them);
3. automatic: ``dra`` when the cluster has GPU nodes of the DRA pool and none of
   the device plugin's, else ``device-plugin`` (today's clusters, mixed ones,
   and an empty inventory keep the default: a DRA pool is opted into).

A label whose value names no backend is an error the pod's creator must fix
(:class:`UnknownBackend`), not silently the default: a typo would otherwise
send the pod to the other pool.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from sharing.api.backend import BACKENDS, DEFAULT_BACKEND, Backend, is_backend
from sharing.admission.inventory import Inventory
from sharing.api.keys import BACKEND_LABEL

UNKNOWN_BACKEND: Final = "UnknownBackend"
"""The denial reason of :class:`UnknownBackend`."""


class UnknownBackend(ValueError):
    """A pool label whose value is not a backend; the message names the label, where it is and the values."""

    reason: Final = UNKNOWN_BACKEND

    def __init__(self, where: str, value: object) -> None:
        self.message = (
            f"{where} label {BACKEND_LABEL}={str(value)[:64]!r} is not a gpupack backend; "
            f"valid values: {', '.join(BACKENDS)}"
        )
        super().__init__(self.message)


@dataclass(frozen=True)
class PoolChoice:
    backend: Backend
    why: str
    """Where the choice came from, for the admission message."""


def choose_pool(pod_labels: Mapping[str, object] | None, namespace: str, inventory: Inventory) -> PoolChoice:
    """The pool of a pod with ``pod_labels`` in ``namespace``; raises :class:`UnknownBackend`."""
    for where, labels in (("pod", pod_labels), (f"namespace {namespace!r}", inventory.namespace_labels.get(namespace))):
        value = (labels or {}).get(BACKEND_LABEL)
        if value is None:
            continue
        if not is_backend(value):
            raise UnknownBackend(where, value)
        return PoolChoice(value, f"{where} label {BACKEND_LABEL}={value}")
    if inventory.pool("dra").nodes and not inventory.pool("device-plugin").nodes:
        return PoolChoice("dra", "every GPU node of the cluster is in the DRA pool")
    return PoolChoice(DEFAULT_BACKEND, "the default pool")
