"""Fit checks against NVIDIA's documented valid and invalid MIG combinations."""

from __future__ import annotations

import pytest

from mig.catalog import all_models, get_model
from mig.errors import UnknownProfileError
from mig.geometry import best_placement, can_add, fits, fits_with, free_capacity, is_maximal, maximal_layouts, validate_layout
from mig.model import PlacedInstance, Placement

A100 = get_model("A100-40GB")
H100 = get_model("H100")
A30 = get_model("A30")

# (id, model, profiles, fits?) -- combinations from the MIG user guide's A100 diagrams.
CASES = [
    ("a100-4g+2g+1g", A100, ["4g.20gb", "2g.10gb", "1g.5gb"], True),
    ("a100-3g+3g", A100, ["3g.20gb", "3g.20gb"], True),
    ("a100-4g+3g", A100, ["4g.20gb", "3g.20gb"], True),
    ("a100-3g+2g+2g", A100, ["3g.20gb", "2g.10gb", "2g.10gb"], True),
    ("a100-3g+2g+1g+1g", A100, ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"], True),
    ("a100-7x1g", A100, ["1g.5gb"] * 7, True),
    ("a100-balanced", A100, ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"], True),
    ("a100-4x1g.10gb", A100, ["1g.10gb"] * 4, True),
    ("a100-4g+4g", A100, ["4g.20gb", "4g.20gb"], False),
    ("a100-two-me", A100, ["1g.5gb+me", "1g.5gb+me"], False),
    ("a100-7x1g+1g", A100, ["1g.5gb"] * 8, False),
    ("a100-7x1g+1g.10gb", A100, ["1g.5gb"] * 7 + ["1g.10gb"], False),
    ("a100-7x1g+me", A100, ["1g.5gb"] * 7 + ["1g.5gb+me"], False),
    ("a100-7g+1g", A100, ["7g.40gb", "1g.5gb"], False),
    ("a100-3x3g", A100, ["3g.20gb"] * 3, False),
    ("a100-4x2g", A100, ["2g.10gb"] * 4, False),
    ("a100-5x1g.10gb", A100, ["1g.10gb"] * 5, False),
    ("a100-4g+2g+2g", A100, ["4g.20gb", "2g.10gb", "2g.10gb"], False),
    ("h100-4g+2g+1g", H100, ["4g.40gb", "2g.20gb", "1g.10gb"], True),
    ("h100-3g+3g", H100, ["3g.40gb", "3g.40gb"], True),
    ("h100-4g+4g", H100, ["4g.40gb", "4g.40gb"], False),
    ("a30-4x1g", A30, ["1g.6gb"] * 4, True),
    ("a30-2g+2g", A30, ["2g.12gb", "2g.12gb"], True),
    ("a30-2g+1g+1g", A30, ["2g.12gb", "1g.6gb", "1g.6gb"], True),
    ("a30-4g+1g", A30, ["4g.24gb", "1g.6gb"], False),
    ("a30-two-me-profiles", A30, ["1g.6gb+me", "2g.12gb+me"], False),
    ("a30-5x1g", A30, ["1g.6gb"] * 5, False),
]


@pytest.mark.parametrize(("model", "profiles", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_documented_combinations(model, profiles, expected):  # type: ignore[no-untyped-def]
    placed = fits(model, profiles)
    assert (placed is not None) == expected
    if placed is not None:
        assert sorted(i.profile for i in placed) == sorted(profiles)
        assert validate_layout(model, placed) is None


def test_3g_2g_2g_needs_the_3g_in_the_upper_half() -> None:
    placed = fits(A100, ["3g.20gb", "2g.10gb", "2g.10gb"])
    assert placed is not None
    three = next(i for i in placed if i.profile == "3g.20gb")
    assert three.placement == Placement(4, 4)
    lower_3g = PlacedInstance("3g.20gb", Placement(0, 4))
    assert fits_with(A100, [lower_3g], ["2g.10gb", "2g.10gb"]) is None


def test_unknown_profile_names_the_valid_ones() -> None:
    with pytest.raises(UnknownProfileError, match="valid profiles: 1g.10gb"):
        fits(H100, ["1g.5gb"])


@pytest.mark.parametrize(
    ("existing", "new", "reason"),
    [
        ([], PlacedInstance("3g.20gb", Placement(2, 4)), "cannot be placed at 2:4"),
        ([PlacedInstance("4g.20gb", Placement(0, 4))], PlacedInstance("1g.5gb", Placement(3, 1)), "overlaps"),
        ([PlacedInstance("1g.5gb+me", Placement(0, 1))], PlacedInstance("1g.5gb+me", Placement(1, 1)), "at most 1"),
        ([PlacedInstance("1g.5gb", Placement(i, 1)) for i in range(6)] + [PlacedInstance("1g.10gb", Placement(6, 2))],
         PlacedInstance("1g.5gb", Placement(7, 1)), "cannot be placed at 7:1"),
    ],
    ids=["bad-placement", "overlap", "max-count", "slice-7-alone"],
)
def test_can_add_gives_the_nvml_reason(existing, new, reason):  # type: ignore[no-untyped-def]
    problem = can_add(A100, existing, new)
    assert problem is not None and reason in problem


def test_a30_media_extensions_are_exclusive_across_profiles() -> None:
    problem = can_add(A30, [PlacedInstance("1g.6gb+me", Placement(0, 1))], PlacedInstance("2g.12gb+me", Placement(2, 2)))
    assert problem is not None and "+me" in problem


def test_known_maximal_layouts_are_reported() -> None:
    layouts = set(maximal_layouts(A100))
    assert ("7g.40gb",) in layouts
    assert ("3g.20gb", "3g.20gb") in layouts
    assert ("3g.20gb", "4g.20gb") in layouts
    assert tuple(sorted(["1g.5gb"] * 7)) in layouts
    assert ("4g.20gb",) not in layouts  # a 3g still fits next to it


@pytest.mark.parametrize("model", all_models(), ids=lambda m: m.product)
def test_every_profile_alone_is_reachable_from_some_maximal_layout(model) -> None:  # type: ignore[no-untyped-def]
    layouts = maximal_layouts(model)
    assert layouts
    used = {name for layout in layouts for name in layout}
    assert used == set(model.profile_names)


def test_free_capacity_counts_what_still_fits() -> None:
    existing = [PlacedInstance("4g.40gb", Placement(0, 4))]
    free = free_capacity(H100, existing)
    assert free["3g.40gb"] == 1 and free["1g.10gb"] == 3 and free["4g.40gb"] == 0 and free["7g.80gb"] == 0


def test_best_placement_keeps_the_big_profiles_possible() -> None:
    # A single 1g placed at slice 0 would block both 4g and 7g; best_placement avoids the low half.
    chosen = best_placement(H100, [], "1g.10gb")
    assert chosen is not None and chosen.placement.start >= 4
    after = [chosen]
    assert fits_with(H100, after, ["4g.40gb"]) is not None


def test_is_maximal_on_a_non_fitting_layout_is_false() -> None:
    assert not is_maximal(A100, ["4g.20gb", "4g.20gb"])
