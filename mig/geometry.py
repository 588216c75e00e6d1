"""Which MIG instances fit together on one GPU, and where.

The rules are NVML's (and what the simulated NVML backend enforces):

1. every instance sits at one of its profile's allowed placements;
2. no two instances share a memory slice;
3. at most ``max_count`` instances of a profile;
4. the compute slices of all instances add up to at most the GPU's;
5. at most one ``+me`` instance (there is one set of media extensions).

All searches are exact (backtracking over allowed placements; a GPU has at most
8 memory slices, so the search space is tiny) and cached per (model, multiset),
which makes repeated fit checks cost a dictionary lookup.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from functools import lru_cache

from mig.model import GpuModel, PlacedInstance, Placement, Profile


def validate_layout(model: GpuModel, instances: Sequence[PlacedInstance]) -> str | None:
    """None if ``instances`` is a valid layout of ``model``, else the first rule broken."""
    used = 0
    compute = 0
    media = 0
    counts: Counter[str] = Counter()
    for instance in instances:
        if not model.has_profile(instance.profile):
            return f"unknown MIG profile {instance.profile!r} for {model.product}; valid: {', '.join(model.profile_names)}"
        profile = model.profile(instance.profile)
        if instance.placement not in profile.placements:
            allowed = ", ".join(str(p) for p in profile.placements)
            return f"{instance.profile} cannot be placed at {instance.placement}; allowed placements (start:size): {allowed}"
        if used & instance.placement.mask:
            return f"{instance} overlaps another instance's memory slices"
        used |= instance.placement.mask
        counts[profile.name] += 1
        if counts[profile.name] > profile.max_count:
            return f"at most {profile.max_count} instance(s) of {profile.name} fit on {model.product}"
        compute += profile.compute_slices
        media += profile.media_extensions
    if compute > model.compute_slices:
        return f"instances need {compute} compute slices; {model.product} has {model.compute_slices}"
    if media > 1:
        return "at most one +me instance fits on a GPU (it owns the GPU's only media extensions)"
    return None


def can_add(model: GpuModel, existing: Sequence[PlacedInstance], new: PlacedInstance) -> str | None:
    """None if ``new`` can be created next to ``existing``, else the reason (as NVML would refuse)."""
    return validate_layout(model, (*existing, new))


def _profiles_of(model: GpuModel, names: Iterable[str]) -> list[Profile]:
    return [model.profile(name) for name in names]


def _quick_reject(model: GpuModel, fixed: tuple[PlacedInstance, ...], profiles: list[Profile]) -> bool:
    """Cheap necessary conditions, so most impossible requests never reach the search."""
    all_profiles = _profiles_of(model, (i.profile for i in fixed)) + profiles
    if sum(p.compute_slices for p in all_profiles) > model.compute_slices:
        return True
    if sum(p.memory_slices for p in all_profiles) > model.memory_slices:
        return True
    if sum(p.media_extensions for p in all_profiles) > 1:
        return True
    counts = Counter(p.name for p in all_profiles)
    return any(counts[p.name] > p.max_count for p in all_profiles)


def _search(profiles: list[Profile], used: int, floor: dict[str, int]) -> list[Placement] | None:
    """Place ``profiles`` (largest first) into the free slices of ``used``; backtracking."""
    if not profiles:
        return []
    head, rest = profiles[0], profiles[1:]
    # Copies of one profile are interchangeable: give them increasing starts only.
    lowest = floor.get(head.name, -1)
    for placement in head.placements:
        if placement.start <= lowest or used & placement.mask:
            continue
        tail = _search(rest, used | placement.mask, {**floor, head.name: placement.start})
        if tail is not None:
            return [placement, *tail]
    return None


@lru_cache(maxsize=65536)
def _fits_cached(model: GpuModel, fixed: tuple[PlacedInstance, ...], names: tuple[str, ...]) -> tuple[PlacedInstance, ...] | None:
    profiles = _profiles_of(model, names)
    if _quick_reject(model, fixed, profiles):
        return None
    if validate_layout(model, fixed) is not None:
        return None
    used = 0
    for instance in fixed:
        used |= instance.placement.mask
    # Largest (and most constrained) first prunes the search early.
    order = sorted(profiles, key=lambda p: (-p.memory_slices, -p.compute_slices, len(p.placements), p.name))
    placements = _search(order, used, {})
    if placements is None:
        return None
    return tuple(sorted(PlacedInstance(p.name, pl) for p, pl in zip(order, placements, strict=True)))


def fits(model: GpuModel, profile_names: Iterable[str]) -> tuple[PlacedInstance, ...] | None:
    """Placements for the multiset ``profile_names`` on an empty GPU, or None if it does not fit.

    Raises ``UnknownProfileError`` for a name the model does not have.
    """
    return fits_with(model, (), profile_names)


def fits_with(
    model: GpuModel, fixed: Sequence[PlacedInstance], profile_names: Iterable[str]
) -> tuple[PlacedInstance, ...] | None:
    """Placements for new instances ``profile_names`` next to the ``fixed`` ones, or None."""
    names = tuple(sorted(profile_names))
    for name in names:
        model.profile(name)  # raises a clear error for unknown names
    return _fits_cached(model, tuple(sorted(fixed)), names)


def free_capacity(model: GpuModel, existing: Sequence[PlacedInstance]) -> dict[str, int]:
    """For each profile, how many more instances of it alone could still be created."""
    result: dict[str, int] = {}
    for profile in model.profiles:
        count = 0
        while fits_with(model, existing, [profile.name] * (count + 1)) is not None:
            count += 1
        result[profile.name] = count
    return result


def best_placement(model: GpuModel, existing: Sequence[PlacedInstance], profile_name: str) -> PlacedInstance | None:
    """Where to create one more ``profile_name`` instance so that the most capacity stays usable.

    Among the valid placements, choose the one after which the largest profiles can
    still be created (scored by the memory slices of every profile that still fits
    once); ties go to the highest start, which packs small instances at the top
    and keeps the low slices, where 4g and 7g must start, free.
    """
    profile = model.profile(profile_name)
    best: tuple[int, int] | None = None
    chosen: PlacedInstance | None = None
    for placement in profile.placements:
        candidate = PlacedInstance(profile.name, placement)
        if can_add(model, existing, candidate) is not None:
            continue
        after = (*existing, candidate)
        score = sum(
            p.memory_slices * p.compute_slices for p in model.profiles if fits_with(model, after, [p.name]) is not None
        )
        key = (score, placement.start)
        if best is None or key > best:
            best, chosen = key, candidate
    return chosen


@lru_cache(maxsize=64)
def _all_valid_multisets(model: GpuModel) -> frozenset[tuple[str, ...]]:
    options = [(p, pl) for p in model.profiles for pl in p.placements]
    found: set[tuple[str, ...]] = set()

    def extend(start: int, chosen: list[PlacedInstance]) -> None:
        found.add(tuple(sorted(i.profile for i in chosen)))
        for index in range(start, len(options)):
            profile, placement = options[index]
            candidate = PlacedInstance(profile.name, placement)
            if can_add(model, chosen, candidate) is None:
                chosen.append(candidate)
                extend(index + 1, chosen)
                chosen.pop()

    extend(0, [])
    return frozenset(found)


def is_maximal(model: GpuModel, profile_names: Iterable[str]) -> bool:
    """True if the multiset fits and no further instance of any profile fits with it."""
    names = list(profile_names)
    if fits(model, names) is None:
        return False
    return all(fits(model, [*names, p.name]) is None for p in model.profiles)


def _geometry_key(model: GpuModel) -> tuple[object, ...]:
    """Models with the same slices and profile table (SXM/PCIe twins) share results."""
    return (model.compute_slices, model.memory_slices, model.profiles)


_REPRESENTATIVE: dict[tuple[object, ...], GpuModel] = {}


@lru_cache(maxsize=64)
def _maximal_for_geometry(key: tuple[object, ...]) -> tuple[tuple[str, ...], ...]:
    model = _REPRESENTATIVE[key]
    maximal = [names for names in _all_valid_multisets(model) if names and is_maximal(model, names)]
    return tuple(sorted(maximal, key=lambda names: (-len(names), names)))


def maximal_layouts(model: GpuModel) -> tuple[tuple[str, ...], ...]:
    """Every maximal layout of ``model`` as a sorted multiset of profile names.

    Ordered by decreasing number of instances, then by name, so the output is stable.
    """
    key = _geometry_key(model)
    _REPRESENTATIVE.setdefault(key, model)
    return _maximal_for_geometry(key)


def usable_value(model: GpuModel, layout: Sequence[PlacedInstance]) -> int:
    """How much can still be created: sum of compute x memory slices of every profile that fits once."""
    return sum(
        p.memory_slices * p.compute_slices for p in model.profiles if fits_with(model, layout, [p.name]) is not None
    )


def free_slices(model: GpuModel, layout: Sequence[PlacedInstance]) -> int:
    """Memory slices no instance of ``layout`` covers."""
    used = 0
    for instance in layout:
        used |= instance.placement.mask
    return model.memory_slices - bin(used).count("1")
