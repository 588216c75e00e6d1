"""Would the SharingPolicy in force for a namespace have produced this allocation record?

The record (``gpupack.io/allocation``) is plain text: a pod's creator can write one
that matches the pod's own requests (``Allocation.mismatch`` then finds nothing
wrong) yet names a mode or a MIG profile the namespace's policy forbids. The
webhook never writes such a record, so one that exists was written by hand, and
honouring it would let the tenant step around the policy: the controller would
create and release capacity of the forbidden kind.

:func:`record_problem` is the one rule. The webhook calls it when a pod arrives
carrying a record (``webhook.forged_marks``: its own reinvocation passes, a
hand-written out-of-policy record is refused), and the controller calls it
before it counts or releases a pod (``controller.state.build``), so a record that
escaped the webhook (a pod labelled ``gpupack.io/skip``, a namespace the webhook
does not see, a webhook that was down) is ignored there too.

What the webhook can produce, under the namespace's merged policy
(``sharing.admission.inventory.admission_policy``):

* mode ``mig``, ``mps`` or ``time-slicing`` only where the policy allows it;
* mode ``whole`` only where a shared mode is allowed (it is what a shared-mode
  request gets when no split into replicas holds it);
* mode ``cpu`` anywhere (no GPU);
* MIG profiles (the containers' and a DRA record's ``migFallback``) that the
  policy allows, of a GPU model of the catalog, never a media-extension one; ``migFallback``
  only where ``mig`` is allowed;
* ``replicas`` within what a GPUNode may advertise.
"""

from __future__ import annotations

from typing import Final

from mig.catalog import CATALOG
from sharing.api.allocation import Allocation
from sharing.api.crd import MAX_SHARING_REPLICAS
from sharing.admission.inventory import AdmissionPolicy
from sharing.api.keys import ALLOCATION_ANNOTATION

CATALOG_PROFILES: Final = frozenset(p.name for m in CATALOG for p in m.profiles if not p.media_extensions)
"""Every MIG profile the webhook may choose: those of the GPU models gpupack knows, less the
media-extension (``+me``) ones it never chooses (``sharing.admission.options.covering_profile``)."""
SHARED_MODES: Final = ("mps", "time-slicing")


def record_problem(allocation: Allocation, policy: AdmissionPolicy) -> str | None:
    """Why the webhook, deciding under ``policy``, could not have written ``allocation``; None when it could."""
    mode, allowed = allocation.mode, policy.allowed_modes
    where = f"{ALLOCATION_ANNOTATION} is outside SharingPolicy {policy.name!r}"
    allowed_text = ", ".join(allowed) or "none"
    if mode == "cpu":
        return None
    if mode == "whole":
        if not any(m in allowed for m in SHARED_MODES):
            return (f"{where}: mode 'whole' is given only for a shared-mode request, and neither mps nor "
                    f"time-slicing is allowed in the namespace (allowed modes: {allowed_text})")
    elif mode not in allowed:
        return f"{where}: mode {mode!r} is not allowed in the namespace (allowed modes: {allowed_text})"
    profiles = [c.profile for c in allocation.containers if mode == "mig" and c.profile]
    if allocation.mig_fallback is not None:
        if "mig" not in allowed:
            return (f"{where}: migFallback names MIG profiles, and mode 'mig' is not allowed in the namespace "
                    f"(allowed modes: {allowed_text})")
        profiles += allocation.mig_fallback
    for profile in profiles:
        if profile not in CATALOG_PROFILES:
            return f"{where}: MIG profile {profile!r} is not one the webhook chooses (a profile of a known GPU, without media extensions)"
        if not policy.allows_profile(profile):
            return (f"{where}: MIG profile {profile!r} is not allowed (allowed profiles: "
                    f"{', '.join(policy.allowed_profiles)})")
    if allocation.replicas is not None and not 1 <= allocation.replicas <= MAX_SHARING_REPLICAS:
        return f"{where}: replicas {allocation.replicas} is outside 1..{MAX_SHARING_REPLICAS}"
    return None
