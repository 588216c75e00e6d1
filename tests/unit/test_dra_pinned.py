"""The pinned-devices annotation of a controller-made ResourceClaim: round trip, refusals, CEL pins."""

from __future__ import annotations

import json
import re

import pytest

from sharing.dra import names
from sharing.dra.pinned import ANNOTATION, Pinned, PinnedDevice, PinnedError

GiB = 2**30
SHARE = PinnedDevice("gpu-0", "shared", 1, milli=300, memory_bytes=20 * GiB)
MIG = PinnedDevice("gpu-1", "mig", 0, profile="1g.10gb+me", start=3)
WHOLE = PinnedDevice("gpu-2", "gpu", 4)


def test_a_record_round_trips_and_its_text_is_stable() -> None:
    pinned = Pinned("node-a", (SHARE, MIG, WHOLE))
    text = pinned.to_annotation()
    assert Pinned.from_annotation(text) == pinned
    assert Pinned.from_annotation(text).to_annotation() == text
    assert json.loads(text)["devices"][0] == {"request": "gpu-0", "kind": "shared", "gpu": 1, "milli": 300,
                                              "memoryBytes": 20 * GiB}


def test_device_names_are_the_ones_the_node_publishes() -> None:
    assert SHARE.device == names.shared_device_name(1) == "gpu-1-shared"
    assert MIG.device == "gpu-0-mig-1g-10gb-me-3"
    assert WHOLE.device == "gpu-4"


def test_selectors_pin_the_gpu_index_and_a_mig_start() -> None:
    assert [s["cel"]["expression"] for s in SHARE.selectors()] == ['device.attributes["gpu.gpupack.io"].index == 1']
    assert [s["cel"]["expression"] for s in MIG.selectors()] == [
        'device.attributes["gpu.gpupack.io"].index == 0',
        'device.attributes["gpu.gpupack.io"].placementStart == 3']


@pytest.mark.parametrize(("text", "problem"), [
    (None, "not a string"),
    ("{", "not JSON"),
    ("[]", "not a JSON object"),
    ('{"version": "v2", "node": "a", "devices": []}', "version 'v2'"),
    ('{"version": "v1", "devices": [{}]}', "names no node"),
    ('{"version": "v1", "node": "a", "devices": []}', "lists no devices"),
    ('{"version": "v1", "node": "a", "devices": [7]}', "devices[0] is not an object"),
    ('{"version": "v1", "node": "a", "devices": [{"kind": "gpu", "gpu": 0}]}', "names no request"),
    ('{"version": "v1", "node": "a", "devices": [{"request": "r", "kind": "tpu", "gpu": 0}]}', "kind 'tpu'"),
    ('{"version": "v1", "node": "a", "devices": [{"request": "r", "kind": "gpu"}]}', "names no GPU"),
    ('{"version": "v1", "node": "a", "devices": [{"request": "r", "kind": "gpu", "gpu": "0"}]}', "not an integer"),
    ('{"version": "v1", "node": "a", "devices": [{"request": "r", "kind": "gpu", "gpu": -1}]}', "negative"),
    ('{"version": "v1", "node": "a", "devices": [{"request": "r", "kind": "mig", "gpu": 0}]}', "profile and a start"),
    ('{"version": "v1", "node": "a", "devices": [{"request": "r", "kind": "shared", "gpu": 0}]}', "positive milli"),
], ids=lambda v: str(v)[:40])
def test_a_malformed_record_is_refused_naming_the_problem(text: object, problem: str) -> None:
    with pytest.raises(PinnedError, match=re.escape(problem)) as caught:
        Pinned.from_annotation(text)
    assert ANNOTATION in str(caught.value)
