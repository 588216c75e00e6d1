"""Property tests of the geometry engine over every catalog model."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from mig.catalog import all_models
from mig.geometry import fits, fits_with, is_maximal, maximal_layouts, validate_layout
from mig.migparted import builtin_configs, dump_config, parse_config
from mig.model import GpuModel, PlacedInstance
from mig.reach import plan_reconfiguration

MODELS = all_models()
models = st.sampled_from(MODELS)


@st.composite
def model_and_profiles(draw: st.DrawFn) -> tuple[GpuModel, list[str]]:
    model = draw(models)
    names = draw(st.lists(st.sampled_from(model.profile_names), max_size=8))
    return model, names


@st.composite
def model_and_layout(draw: st.DrawFn) -> tuple[GpuModel, list[PlacedInstance]]:
    """A random valid layout, built by adding random allowed instances."""
    model = draw(models)
    layout: list[PlacedInstance] = []
    for _ in range(draw(st.integers(0, 8))):
        profile = draw(st.sampled_from(model.profiles))
        placement = draw(st.sampled_from(profile.placements))
        candidate = PlacedInstance(profile.name, placement)
        if validate_layout(model, [*layout, candidate]) is None:
            layout.append(candidate)
    return model, layout


def _slices_used(instances: list[PlacedInstance] | tuple[PlacedInstance, ...]) -> list[int]:
    return [s for i in instances for s in range(i.placement.start, i.placement.end)]


@settings(max_examples=300, deadline=None)
@given(model_and_profiles())
def test_reported_placements_are_allowed_and_disjoint(case: tuple[GpuModel, list[str]]) -> None:
    model, names = case
    placed = fits(model, names)
    if placed is None:
        return
    assert Counter(i.profile for i in placed) == Counter(names)
    slices = _slices_used(placed)
    assert len(slices) == len(set(slices)), "instances overlap"
    for instance in placed:
        assert instance.placement in model.profile(instance.profile).placements
    assert sum(model.profile(n).compute_slices for n in names) <= model.compute_slices


@settings(max_examples=200, deadline=None)
@given(model_and_layout())
def test_fit_agrees_with_an_explicitly_built_layout(case: tuple[GpuModel, list[PlacedInstance]]) -> None:
    # Any layout built instance by instance under NVML's rules must be found by the search.
    model, layout = case
    assert fits(model, [i.profile for i in layout]) is not None


def test_every_maximal_layout_accepts_nothing_more() -> None:
    for model in MODELS:
        for layout in maximal_layouts(model):
            assert fits(model, layout) is not None
            for profile in model.profiles:
                assert fits(model, [*layout, profile.name]) is None, (model.product, layout, profile.name)


@settings(max_examples=200, deadline=None)
@given(model_and_layout(), st.data())
def test_plans_never_touch_in_use_instances(case: tuple[GpuModel, list[PlacedInstance]], data: st.DataObject) -> None:
    model, current = case
    in_use = data.draw(st.lists(st.sampled_from(current), unique=True) if current else st.just([]))
    target = list(data.draw(st.sampled_from(maximal_layouts(model))))
    plan = plan_reconfiguration(model, current, in_use, target)
    if plan is None:
        # Unreachable must be true: no placement of the target keeps the in-use instances.
        kept = Counter(i.profile for i in in_use)
        if not (kept - Counter(target)):
            rest = list((Counter(target) - kept).elements())
            assert fits_with(model, in_use, rest) is None
        return
    for instance in in_use:
        assert instance not in plan.destroy
        assert instance in plan.keep
    assert Counter(i.profile for i in plan.target) == Counter(target)
    assert validate_layout(model, plan.target) is None
    # Executing the plan step by step stays valid at every step.
    state = [i for i in current if i not in plan.destroy]
    assert validate_layout(model, state) is None
    for created in plan.create:
        state.append(created)
        assert validate_layout(model, state) is None


@settings(max_examples=100, deadline=None)
@given(model_and_layout())
def test_plan_to_the_current_layout_is_a_noop(case: tuple[GpuModel, list[PlacedInstance]]) -> None:
    model, current = case
    plan = plan_reconfiguration(model, current, current, [i.profile for i in current])
    assert plan is not None and plan.is_noop()


def test_maximal_layouts_are_maximal_by_is_maximal() -> None:
    for model in MODELS:
        assert all(is_maximal(model, layout) for layout in maximal_layouts(model))


@st.composite
def mig_configs(draw: st.DrawFn) -> str:
    """Random configs in mig-parted's format, written as YAML text."""
    import yaml

    configs = {}
    for index in range(draw(st.integers(1, 3))):
        entries = []
        for _ in range(draw(st.integers(1, 3))):
            entry: dict[str, object] = {}
            if draw(st.booleans()):
                entry["device-filter"] = draw(st.lists(st.sampled_from(["0x20B010DE", "0x233010DE", "0x20B710DE"]), min_size=1, max_size=2, unique=True))
            entry["devices"] = draw(st.one_of(st.just("all"), st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True)))
            enabled = draw(st.booleans())
            entry["mig-enabled"] = enabled
            if enabled:
                entry["mig-devices"] = draw(st.dictionaries(st.sampled_from(["1g.5gb", "1g.10gb", "3g.40gb"]), st.integers(0, 7), max_size=3))
            entries.append(entry)
        configs[f"cfg-{index}"] = entries
    return yaml.safe_dump({"version": "v1", "mig-configs": configs}, sort_keys=False)


@settings(max_examples=150, deadline=None)
@given(mig_configs())
def test_mig_parted_round_trip_is_identity(text: str) -> None:
    import yaml

    config = parse_config(text)
    assert parse_config(dump_config(config)) == config
    assert yaml.safe_load(dump_config(config)) == yaml.safe_load(text)


def test_builtin_configs_round_trip_and_fit() -> None:
    from mig.migparted import check_against_catalog

    config = builtin_configs()
    assert parse_config(dump_config(config)) == config
    assert check_against_catalog(config) == []
