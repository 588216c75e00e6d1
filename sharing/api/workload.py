"""Which workload a pod belongs to: the one reading of a pod's owner for the right-sizer.

The right-sizer keeps one history and one recommendation per workload and container
(issue 35), as the Kubernetes VPA does per target. A pod's workload is its controlling owner
(the ``ownerReferences`` entry with ``controller: true``), lifted one level where the owner is a
Deployment's ReplicaSet: a rollout makes a new ReplicaSet, and the history must outlive it. The
lift reads only the pod: a Deployment names its ReplicaSets ``<deployment>-<pod-template-hash>``
and labels their pods ``pod-template-hash``, so no API read is needed at admission. A pod
without a controlling owner is its own workload (kind ``Pod``).

The recommendation object of a workload is named by :func:`recommendation_name`, in the
workload's namespace, so the webhook, the controller and ``kubectl`` find it without a search.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sharing.api.fields import as_list, as_map

POD_TEMPLATE_HASH_LABEL = "pod-template-hash"
"""The label a Deployment's ReplicaSet puts on its pods (and on itself, as its name's suffix)."""
MAX_NAME = 253
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


@dataclass(frozen=True, order=True)
class WorkloadRef:
    """A workload: its namespace, its kind (``Deployment``, ``StatefulSet``, ``Pod``, ...) and name."""

    namespace: str
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"


def controller_owner(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The object's ownerReference with ``controller: true``, if any (a well-formed one)."""
    for ref in as_list(as_map(obj.get("metadata")).get("ownerReferences")):
        ref = as_map(ref)
        if ref.get("controller") is True and isinstance(ref.get("kind"), str) and isinstance(ref.get("name"), str):
            return ref
    return None


def workload_of(pod: Mapping[str, Any]) -> WorkloadRef:
    """The workload of a pod object (module docstring). The namespace is the pod's."""
    meta = as_map(pod.get("metadata"))
    namespace = str(meta.get("namespace") or "default")
    owner = controller_owner(pod)
    if owner is None:
        return WorkloadRef(namespace, "Pod", str(meta.get("name") or meta.get("generateName") or ""))
    kind, name = str(owner["kind"]), str(owner["name"])
    template_hash = as_map(meta.get("labels")).get(POD_TEMPLATE_HASH_LABEL)
    if (kind == "ReplicaSet" and isinstance(template_hash, str) and template_hash
            and name.endswith("-" + template_hash) and len(name) > len(template_hash) + 1):
        return WorkloadRef(namespace, "Deployment", name[: -len(template_hash) - 1])
    return WorkloadRef(namespace, kind, name)


def recommendation_name(workload: WorkloadRef) -> str:
    """The name of the workload's ``GPURecommendation``: ``<kind>-<name>`` in lower case, or, where
    that is not a valid object name, a valid prefix of it and a hash of the whole, so two
    workloads never share one."""
    plain = f"{workload.kind.lower()}-{workload.name}"
    if len(plain) <= MAX_NAME and _DNS_SUBDOMAIN.match(plain):
        return plain
    digest = hashlib.sha256(f"{workload.kind}/{workload.name}".encode()).hexdigest()[:10]
    prefix = re.sub(r"[^a-z0-9.-]", "-", plain.lower())[: MAX_NAME - 11].strip("-.") or "workload"
    return f"{prefix}-{digest}"


__all__ = ["POD_TEMPLATE_HASH_LABEL", "WorkloadRef", "controller_owner", "recommendation_name", "workload_of"]
