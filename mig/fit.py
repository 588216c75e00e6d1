"""The smallest MIG profile that covers a fractional request (compute milli + memory).

A request of ``milli`` thousandths of a GPU needs ``ceil(milli * compute_slices / 1000)``
compute slices: a 1g instance is 1/7 of an A100's compute (1/4 of an A30's), so a
request of 150 milli needs two slices there. Memory is compared with the instance's
usable memory (``Profile.memory_mib``), not the nominal size in its name, so a
``10Gi`` request never lands on a ``1g.10gb`` instance that holds only 9.5 GiB.

"Smallest" within a model: fewest memory slices, then fewest compute slices, and a
``+me`` profile only when nothing else covers (there is one per GPU). Across models:
least memory left unused, then the smaller share of its GPU, then the product name,
so that big GPUs stay free for big requests and the answer is deterministic.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mig.errors import RequestError
from mig.model import GpuModel, Profile

MILLI_PER_GPU = 1000


@dataclass(frozen=True)
class Covering:
    """A profile on a model that covers a request, with what it leaves unused."""

    model: GpuModel
    profile: Profile
    unused_memory_mib: int
    gpu_share: float
    """Fraction of the GPU the instance takes (the larger of compute and memory shares)."""


def check_request(milli: int, memory_bytes: int) -> None:
    if isinstance(milli, bool) or not isinstance(milli, int):
        raise RequestError(f"compute milli must be an integer in 1..1000, got {milli!r}")
    if not 1 <= milli <= MILLI_PER_GPU:
        raise RequestError(f"compute milli must be in 1..1000 (1000 = a whole GPU), got {milli}")
    if memory_bytes < 0:
        raise RequestError(f"memory must not be negative, got {memory_bytes} bytes")


def compute_slices_needed(model: GpuModel, milli: int) -> int:
    return -(-milli * model.compute_slices // MILLI_PER_GPU)


def covering_profiles(model: GpuModel, milli: int, memory_bytes: int) -> list[Profile]:
    """Every profile of ``model`` covering the request, smallest first."""
    check_request(milli, memory_bytes)
    slices = compute_slices_needed(model, milli)
    covering = [p for p in model.profiles if p.compute_slices >= slices and p.memory_bytes >= memory_bytes]
    return sorted(covering, key=lambda p: (p.memory_slices, p.compute_slices, p.media_extensions, p.profile_id))


def smallest_covering_profile(model: GpuModel, milli: int, memory_bytes: int) -> Profile | None:
    """The smallest profile of ``model`` covering the request, or None if none does."""
    covering = covering_profiles(model, milli, memory_bytes)
    return covering[0] if covering else None


def coverings_across(models: Iterable[GpuModel], milli: int, memory_bytes: int) -> list[Covering]:
    """The smallest covering profile on each model that has one, best model first."""
    check_request(milli, memory_bytes)
    found: list[Covering] = []
    for model in models:
        profile = smallest_covering_profile(model, milli, memory_bytes)
        if profile is None:
            continue
        share = max(profile.compute_slices / model.compute_slices, profile.memory_slices / model.memory_slices)
        unused = profile.memory_mib - -(-memory_bytes // (1024 * 1024))
        found.append(Covering(model, profile, unused, share))
    return sorted(found, key=lambda c: (c.unused_memory_mib, c.gpu_share, c.model.product))


def smallest_covering_across(models: Iterable[GpuModel], milli: int, memory_bytes: int) -> Covering:
    """The best covering over ``models``; raises ``RequestError`` saying why none covers."""
    model_list = list(models)
    found = coverings_across(model_list, milli, memory_bytes)
    if found:
        return found[0]
    if not model_list:
        raise RequestError("no GPU models to choose from")
    largest = max(model_list, key=lambda m: max(p.memory_mib for p in m.profiles))
    biggest = max(largest.profiles, key=lambda p: p.memory_mib)
    raise RequestError(
        f"no MIG profile covers {milli} milli and {memory_bytes / 2**30:.2f} GiB; "
        f"the largest is {biggest.name} on {largest.product} with {biggest.memory_mib / 1024:.2f} GiB"
    )
