"""GPUNode ``status.reconfiguration`` is typed in full (issue 33, item 2): what the node agent writes
there still validates, a journal round-trips (an absent device-plugin label included), and a deep or
unknown value is refused where before the schema kept any unknown field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from mig.migparted import entries_to_data
from mig.model import PlacedInstance, Placement
from node.base.journal import Journal
from node.layouts.direct import journal_from_status, journal_wire
from node.base.operator_mode import _entry
from sharing.api.crd import GPUNodeStatus, ReconfigurationStatus


def journal(label: str | None) -> Journal:
    one = PlacedInstance("1g.10gb", Placement(0, 1))
    return Journal(gpu_uuid="GPU-1234", gpu_index=2, generation=7, previous=(), target=(one,), destroy=(),
                   create=(one,), phase="Applying", started_at=1_700_000_000.25, updated_at=1_700_000_001.0,
                   reason="x" * 5000, device_plugin_paused=True, device_plugin_label=label,
                   steps=("Applying: " + "y" * 5000,))


@pytest.mark.parametrize("label", ["true", "false", None])
def test_direct_mode_journal_validates_and_round_trips(label: str | None) -> None:
    wire = json.loads(json.dumps(journal_wire(journal(label))))  # as the API server hands it back
    wire = {k: v for k, v in wire.items() if v is not None}  # the API server prunes nulls
    ReconfigurationStatus.model_validate(wire)
    back = journal_from_status(wire)
    assert back is not None and back.device_plugin_label == label and back.create == journal(label).create


def test_operator_mode_entry_validates() -> None:
    entry = {"phase": "Applying", "mode": "operator", "migConfig": "gpupack-n1-g7", "targetGeneration": 7,
             "startedAt": "2026-01-01T00:00:00Z", "message": "GPUs [0] via mig-manager",
             "migConfigEntries": entries_to_data([_entry(0, ["1g.10gb", "1g.10gb"]), _entry(1, None)]),
             "step": 0, "plan": [{"op": "mig-config", "gpus": [0]}]}
    ReconfigurationStatus.model_validate(json.loads(json.dumps(entry)))


def deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize("where", ["extra", "plan", "migConfigEntries"])
def test_deep_or_unknown_values_are_refused(where: str) -> None:
    status: dict[str, Any] = {"phase": "Applying"}
    if where == "extra":
        status["x"] = deep(50)
    elif where == "plan":
        status["plan"] = [{"op": "create", "instance": "1g.10gb@0:1", "more": deep(50)}]
    else:
        status["migConfigEntries"] = [{"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": deep(50)}}]
    with pytest.raises(ValidationError):
        GPUNodeStatus.model_validate({"reconfiguration": status})
