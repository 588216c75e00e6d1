"""The XID table (node.health.xids): built-in facts, unknown XIDs, and the admin's override table."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.health.xids import (
    BUILTIN,
    MAX_XID,
    XID_TABLE_CONFIGMAP,
    XidRule,
    XidTableError,
    classify,
    merged,
    parse_overrides,
)

APPLICATION_XIDS = (13, 31, 43, 45, 68, 109)


# ------------------------------------------------------------------ built-in table
@pytest.mark.parametrize("xid", APPLICATION_XIDS)
def test_application_xids_leave_the_gpu_healthy(xid: int) -> None:
    rule = classify(xid, BUILTIN)
    assert rule.healthy and rule.action == "application" and rule.known
    assert rule.xid == xid


@pytest.mark.parametrize(
    ("xid", "recovery"),
    [(48, "ResetGpu"), (79, "RebootNode"), (94, "ResetGpu"), (95, "ResetGpu"), (119, "ResetGpu"),
     (120, "ResetGpu")],
    ids=["48-dbe", "79-off-the-bus", "94-contained-ecc", "95-uncontained-ecc", "119-gsp-timeout", "120-gsp-error"],
)
def test_critical_xids_are_unhealthy_with_their_recovery(xid: int, recovery: str) -> None:
    rule = classify(xid, BUILTIN)
    assert not rule.healthy and rule.action == "unhealthy" and rule.known
    assert rule.recovery == recovery


def test_only_the_six_application_xids_are_healthy_in_the_builtin_table() -> None:
    assert sorted(x for x, r in BUILTIN.items() if r.healthy) == sorted(APPLICATION_XIDS)
    assert all(rule.xid == xid for xid, rule in BUILTIN.items())
    assert [x for x, r in BUILTIN.items() if r.recovery == "RebootNode"] == [79]


@pytest.mark.parametrize("xid", [1, 9999, 12345, MAX_XID])
def test_an_unknown_xid_is_treated_as_fatal_and_says_so(xid: int) -> None:
    assert xid not in BUILTIN
    rule = classify(xid, BUILTIN)
    assert not rule.healthy and rule.action == "unhealthy"
    assert rule.known is False
    assert rule.recovery == "ResetGpu"
    assert "treated as fatal" in rule.description
    assert str(xid) in rule.description and XID_TABLE_CONFIGMAP in rule.description


@given(st.integers(min_value=1, max_value=MAX_XID))
def test_classify_answers_for_every_xid(xid: int) -> None:
    rule = classify(xid, BUILTIN)
    assert rule.xid == xid
    assert rule.known == (xid in BUILTIN)
    assert rule.healthy == (xid in APPLICATION_XIDS)


# ------------------------------------------------------------------ override table
VALID = """
- xid: 13
  action: unhealthy
  recovery: RebootNode
  description: our app never causes 13
- xid: 4242
  action: application
"""


def test_a_valid_table_overrides_and_extends_the_builtin_one() -> None:
    overrides = parse_overrides(VALID)
    assert set(overrides) == {13, 4242}
    assert overrides[13] == XidRule(13, "unhealthy", "RebootNode", "our app never causes 13")
    assert overrides[4242].action == "application" and overrides[4242].recovery == "ResetGpu"
    assert overrides[4242].description  # a default description
    table = merged(overrides)
    assert not classify(13, table).healthy and classify(13, table).recovery == "RebootNode"
    assert classify(4242, table).healthy and classify(4242, table).known
    # Everything else is the built-in table.
    assert classify(79, table) == BUILTIN[79]
    assert classify(31, table).healthy
    assert set(table) == set(BUILTIN) | {4242}
    # The built-in table itself is untouched.
    assert BUILTIN[13].healthy and 4242 not in BUILTIN


@pytest.mark.parametrize("text", ["", "   \n", "# only a comment\n", "~"])
def test_an_empty_table_overrides_nothing(text: str) -> None:
    assert parse_overrides(text) == {}
    assert merged(parse_overrides(text)) == dict(BUILTIN)


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        pytest.param("xid: 13\naction: unhealthy\n", ["must be a list", "dict"], id="mapping-not-list"),
        pytest.param("just text", ["must be a list", "str"], id="scalar-not-list"),
        pytest.param("- 13\n", ["entry 0", "must be a mapping", "13"], id="entry-not-mapping"),
        pytest.param("- {xid: 48, action: unhealthy}\n- [1, 2]\n", ["entry 1", "must be a mapping"],
                     id="second-entry-not-mapping"),
        pytest.param("- {xid: 48, action: unhealthy, recvery: ResetGpu}\n", ["entry 0", "unknown field", "recvery"],
                     id="unknown-field"),
        pytest.param("- {xid: 0, action: unhealthy}\n", ["entry 0", "xid must be an integer", "0"], id="xid-0"),
        pytest.param("- {xid: -1, action: unhealthy}\n", ["entry 0", "xid must be an integer", "-1"], id="xid-neg"),
        pytest.param("- {xid: x, action: unhealthy}\n", ["entry 0", "xid must be an integer", "'x'"], id="xid-text"),
        pytest.param("- {xid: true, action: unhealthy}\n", ["entry 0", "xid must be an integer", "True"],
                     id="xid-bool"),
        pytest.param("- {xid: 70000, action: unhealthy}\n", ["entry 0", "xid must be an integer", "70000"],
                     id="xid-too-big"),
        pytest.param("- {action: unhealthy}\n", ["entry 0", "xid must be an integer", "None"], id="xid-missing"),
        pytest.param("- {xid: 1.5, action: unhealthy}\n", ["entry 0", "xid must be an integer"], id="xid-float"),
        pytest.param("- {xid: 48, action: fatal}\n", ["entry 0 (xid 48)", "action must be one of", "fatal"],
                     id="bad-action"),
        pytest.param("- {xid: 48}\n", ["entry 0 (xid 48)", "action must be one of"], id="missing-action"),
        pytest.param("- {xid: 48, action: unhealthy, recovery: Pray}\n",
                     ["entry 0 (xid 48)", "recovery must be one of", "Pray"], id="bad-recovery"),
        pytest.param("- {xid: 48, action: unhealthy}\n- {xid: 7, action: unhealthy}\n- {xid: 48, action: application}\n",
                     ["entry 2 (xid 48)", "listed twice"], id="duplicate-xid"),
        pytest.param("- {xid: 48, action: unhealthy, description: " + "d" * 201 + "}\n",
                     ["entry 0 (xid 48)", "description", "200"], id="long-description"),
        pytest.param("- {xid: 48, action: unhealthy, description: 42}\n",
                     ["entry 0 (xid 48)", "description"], id="description-not-text"),
        pytest.param("- {xid: 48, action: [unhealthy\n", ["not YAML"], id="bad-yaml"),
        pytest.param("- xid: 48\n  action: unhealthy\n bad indent: 1\n", ["not YAML"], id="bad-yaml-indent"),
    ],
)
def test_a_malformed_table_is_rejected_naming_the_entry(text: str, needles: list[str]) -> None:
    with pytest.raises(XidTableError) as info:
        parse_overrides(text)
    message = str(info.value)
    for needle in needles:
        assert needle in message, message
    assert isinstance(info.value, ValueError)


def test_a_description_of_exactly_200_characters_is_accepted() -> None:
    rules = parse_overrides("- {xid: 48, action: unhealthy, description: " + "d" * 200 + "}\n")
    assert rules[48].description == "d" * 200


@given(st.lists(st.tuples(st.integers(min_value=1, max_value=MAX_XID), st.sampled_from(["application", "unhealthy"]),
                          st.sampled_from(["ResetGpu", "RebootNode", "Acknowledge"])),
                unique_by=lambda t: t[0], max_size=8))
def test_valid_tables_round_trip(entries: list[tuple[int, str, str]]) -> None:
    text = "".join(f"- {{xid: {x}, action: {a}, recovery: {r}}}\n" for x, a, r in entries)
    rules = parse_overrides(text)
    assert {x: (r.action, r.recovery) for x, r in rules.items()} == {x: (a, r) for x, a, r in entries}
    table = merged(rules)
    for x, a, _r in entries:
        assert classify(x, table).healthy == (a == "application")
