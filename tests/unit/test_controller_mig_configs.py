"""The controller publishes the mig-parted configs agents ask for, and only under the asking node's names."""

from __future__ import annotations

from typing import Any

import pytest

from controller.writes.mig_configs import published_config
from mig.migparted import MigConfigError, parse_config
from sharing.api.gpunode import MigConfigRequest, read_gpunode
from sharing.api.keys import is_mig_config_of, mig_config_name, per_node_name

ADMIN = "version: v1\nmig-configs:\n  all-disabled:\n  - devices: all\n    mig-enabled: false\n"
ENTRIES = [{"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]


def _gpunode(node: str, reconf: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": node, "generation": 3}, "status": {"reconfiguration": reconf}}


def _asking(node: str, name: str, entries: Any = ENTRIES, **extra: Any) -> dict[str, Any]:
    return _gpunode(node, {"phase": "Applying", "mode": "operator", "migConfig": name,
                           "migConfigEntries": entries, **extra})


def _request(node: str, generation: int) -> MigConfigRequest:
    reading = read_gpunode(_asking(node, mig_config_name(node, generation)))
    assert reading is not None and reading.mig_config_request is not None
    return reading.mig_config_request


def test_a_request_is_published_beside_the_admins_configs_and_replaces_the_nodes_older_one() -> None:
    first = published_config(ADMIN, [("node-a", _request("node-a", 1)), ("node-b", _request("node-b", 4))])
    assert first is not None
    assert set(parse_config(first).mig_configs) == {"all-disabled", "gpupack-node-a-g1", "gpupack-node-b-g4"}
    later = published_config(first, [("node-a", _request("node-a", 2))])
    assert later is not None
    assert set(parse_config(later).mig_configs) == {"all-disabled", "gpupack-node-a-g2", "gpupack-node-b-g4"}
    assert published_config(later, [("node-a", _request("node-a", 2))]) is None  # nothing to write


@pytest.mark.parametrize("name", [
    "gpupack-node-b-g1",   # another node's config: what a hijacked agent would try
    "all-disabled",        # the admin's own entry
    "gpupack-node-a",      # not a config name
    "gpupack-node-a-g1-x",
])
def test_an_agent_cannot_ask_for_a_name_that_is_not_its_own(name: str) -> None:
    reading = read_gpunode(_asking("node-a", name))
    assert reading is not None and reading.mig_config_request is None
    assert any("not one of this node's config names" in line for line in reading.skipped)


def test_entries_that_are_not_mig_parted_entries_are_not_published() -> None:
    reading = read_gpunode(_asking("node-a", "gpupack-node-a-g1", [{"devices": [0], "mig-devices": {"1g.10gb": -1}}]))
    assert reading is not None and reading.mig_config_request is None
    assert any("not mig-parted entries" in line for line in reading.skipped)


def test_only_a_reconfiguration_being_applied_asks() -> None:
    for reconf in ({"phase": "Succeeded", "mode": "operator", "migConfig": "gpupack-node-a-g1", "migConfigEntries": ENTRIES},
                   {"phase": "Applying", "mode": "direct", "migConfig": "gpupack-node-a-g1", "migConfigEntries": ENTRIES},
                   {"phase": "Applying", "mode": "operator", "migConfig": "gpupack-node-a-g1"}):
        reading = read_gpunode(_gpunode("node-a", reconf))
        assert reading is not None and reading.mig_config_request is None and reading.skipped == ()


def test_a_configmap_that_is_not_a_mig_parted_config_is_left_alone() -> None:
    with pytest.raises(MigConfigError):
        published_config("version: v2\n", [("node-a", _request("node-a", 1))])


def test_a_request_under_another_nodes_name_is_refused_by_the_publisher_too() -> None:
    with pytest.raises(ValueError, match="not a config name of node"):
        published_config(None, [("node-b", _request("node-a", 1))])


@pytest.mark.parametrize("node", ["a", "a-g1", "n" * 60, "n" * 61])
def test_config_names_belong_to_one_node(node: str) -> None:
    name = mig_config_name(node, 12)
    assert is_mig_config_of(node, name) and len(name) <= 63
    assert name.startswith(per_node_name(node))
    for other in ("a", "a-g1", "n" * 60, "n" * 61):
        if other != node:
            assert not is_mig_config_of(other, name)


def test_the_cycles_snapshot_carries_each_request_once_read() -> None:
    from controller.state.build import build_snapshot

    asking = _asking("node-a", "gpupack-node-a-g3")
    other = _asking("node-b", "gpupack-node-a-g3")  # another node's name: left out, said so
    snapshot = build_snapshot([asking, other], [], [], [])
    assert snapshot.mig_config_requests == (("node-a", _request("node-a", 3)),)
    assert any("node-b" in line for line in snapshot.skipped_entries)
