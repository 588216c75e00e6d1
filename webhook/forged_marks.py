"""gpupack's marks on a pod, and who may put them there: only the webhook.

The allocation record (``gpupack.io/allocation``), the scheduling gate
``gpupack.io/capacity`` and, on the DRA node pool, the ``spec.resourceClaims``
entry ``gpupack`` all make gpupack count a pod as using GPUs or hold it back.
A pod may carry them only as the webhook left them (its own reinvocation sees
them again): a record must describe what the pod requests
(``sharing.api.allocation.trusted_allocation``) and be one the namespace's
SharingPolicy could have produced (``sharing.admission.record_policy.record_problem``: a
hand-written record matching the pod's own requests must not carry a mode or
MIG profile the policy forbids), and a claim entry needs a trusted DRA record
naming that claim, and the record of a right-sized pod (``gpupack.io/right-sized-from``)
needs the allocation record beside it. Anything else was written by the pod's creator and is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sharing.api.allocation import has_capacity_gate, trusted_allocation
from sharing.api.backend import POD_CLAIM
from sharing.api.keys import ALLOCATION_ANNOTATION, BACKEND_LABEL, CAPACITY_GATE, RIGHT_SIZED_ANNOTATION
from sharing.admission.inventory import AdmissionPolicy
from sharing.api.fields import as_list, as_map
from sharing.admission.record_policy import record_problem
from sharing.api.request import AdmissionRefusal, Reason


def _claim_entry(spec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod's ``spec.resourceClaims`` entry named ``gpupack``, if any."""
    return next((as_map(e) for e in as_list(spec.get("resourceClaims")) if as_map(e).get("name") == POD_CLAIM), None)


def refuse_taken_claim_name(pod: dict[str, Any]) -> None:
    """A pod asking for gpupack resources must leave the claim entry ``gpupack`` to the webhook:
    one its creator wrote would point gpupack's containers at a claim gpupack never placed."""
    entry = _claim_entry(as_map(pod.get("spec")))
    if entry is not None:
        raise AdmissionRefusal(
            Reason.FORGED_ALLOCATION,
            f"spec.resourceClaims entry {POD_CLAIM!r} is gpupack's; only its webhook adds it (the pod asks for "
            f"gpupack.io resources, which the webhook turns into that entry: rename yours)",
        )


def refuse_forged_marks(pod: dict[str, Any], policy: AdmissionPolicy | None) -> None:
    """A pod that asks for no gpupack resource may carry gpupack's allocation and gate only as the
    webhook left them (its own reinvocation): the record must match what the pod requests, and
    ``policy`` (the namespace's merged SharingPolicy; None while the inventory is not synced)
    must allow what it records.

    Anything else was written by the pod's creator: a forged allocation would make gpupack count
    GPUs the pod does not use, and a bare gate would hold the pod forever.
    """
    annotations, spec = as_map(as_map(pod.get("metadata")).get("annotations")), as_map(pod.get("spec"))
    text = annotations.get(ALLOCATION_ANNOTATION)
    if text is None:
        if has_capacity_gate(spec):
            raise AdmissionRefusal(
                Reason.FORGED_ALLOCATION,
                f"scheduling gate {CAPACITY_GATE} is gpupack's; only its webhook adds it (ask for "
                f"gpupack.io/gpu-milli instead of setting it by hand)",
            )
        if _claim_entry(spec) is not None:
            raise _forged_claim_entry("the pod carries no gpupack allocation record")
        if RIGHT_SIZED_ANNOTATION in annotations:
            # The webhook writes it only beside its allocation record, when it sized the pod.
            raise AdmissionRefusal(
                Reason.FORGED_ALLOCATION,
                f"annotation {RIGHT_SIZED_ANNOTATION} is written by gpupack's webhook only, when it sizes a pod "
                f"from its workload's GPURecommendation; remove it",
            )
        return
    allocation, distrust = trusted_allocation(text, spec)
    if allocation is None:
        raise AdmissionRefusal(
            Reason.FORGED_ALLOCATION,
            f"annotation {ALLOCATION_ANNOTATION} is written by gpupack's webhook only, and this one does not "
            f"describe the pod ({distrust}); remove it and ask for gpupack.io/gpu-milli instead",
        )
    if allocation.mode == "cpu":
        raise AdmissionRefusal(
            Reason.FORGED_ALLOCATION,
            f"annotation {ALLOCATION_ANNOTATION} mode 'cpu' is the webhook's for pods labelled "
            f"{BACKEND_LABEL}=dra that ask for no GPU, and this pod is not labelled so; remove the annotation, "
            f"or label the pod",
        )
    if allocation.backend != "dra" and _claim_entry(spec) is not None:
        raise _forged_claim_entry("the pod's gpupack allocation record is not a DRA one")
    if policy is None:
        raise AdmissionRefusal(
            Reason.INVENTORY_NOT_SYNCED,
            f"gpupack webhook has not synced its SharingPolicies yet, so it cannot check annotation "
            f"{ALLOCATION_ANNOTATION} against them; retry shortly",
        )
    problem = record_problem(allocation, policy)
    if problem is not None:
        raise AdmissionRefusal(
            Reason.FORGED_ALLOCATION,
            f"annotation {ALLOCATION_ANNOTATION} is written by gpupack's webhook only, and the webhook would not "
            f"have written this one ({problem}); remove it and ask for gpupack.io/gpu-milli instead",
        )


def _forged_claim_entry(why: str) -> AdmissionRefusal:
    # A trusted DRA record already proves the entry is the one the webhook wrote (its mismatch
    # check compares the claim name), so only entries without one are refused.
    return AdmissionRefusal(
        Reason.FORGED_ALLOCATION,
        f"spec.resourceClaims entry {POD_CLAIM!r} is written by gpupack's webhook only, and {why}; "
        f"rename the entry, or ask for gpupack.io/gpu-milli and let the webhook add it",
    )
