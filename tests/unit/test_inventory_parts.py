"""sharing.admission.inventory_parts: an inventory kept one object at a time equals build_inventory from scratch."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from sharing.admission.inventory import build_inventory
from sharing.admission.inventory_parts import InventoryParts

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"
L4 = "NVIDIA-L4"
HEALTH = {"reason": "Xid79", "message": "fell off the bus", "since": "2026-11-30T01:00:00Z", "recovery": "NodeReboot"}


def gpunode(rng: random.Random, name: str, version: int) -> dict[str, Any]:
    """A GPUNode with a random status: MIG and full GPUs, odd entries, faults, samples, sharing."""
    product = rng.choice([H100, A100, L4, "unknown-gpu"])
    gpus: list[Any] = []
    for index in range(rng.randint(0, 3)):
        gpu: dict[str, Any] = {"index": index, "uuid": f"GPU-{index}", "product": product,
                               "memoryMiB": rng.choice([0, 81559]), "migEnabled": rng.random() < 0.5,
                               "utilization": {"gpuPercent": rng.randint(0, 100), "memoryUsedMiB": rng.randint(0, 9)}}
        if gpu["migEnabled"]:
            gpu["instances"] = [{"profile": rng.choice(["1g.10gb", "3g.40gb"]), "start": s, "size": 1,
                                 "inUse": rng.random() < 0.5} for s in range(rng.randint(0, 3))]
            if rng.random() < 0.1:
                gpu["instances"].append({"start": 4})  # no profile: left out, said so
        if rng.random() < 0.1:
            gpu["health"] = dict(HEALTH, withdrawn=rng.random() < 0.5)
        if rng.random() < 0.1:
            gpu["layoutRefusal"] = {"phase": "Refused", "reason": "policy", "generation": 1}
        gpus.append(gpu)
    if rng.random() < 0.1:
        gpus.append("not an object")
    status: dict[str, Any] = {"product": product, "gpus": gpus, "heartbeatTime": f"2026-12-01T00:00:{version % 60:02d}Z"}
    if rng.random() < 0.6:
        status["sharing"] = {"mode": rng.choice(["mps", "time-slicing", "none"]), "replicas": rng.randint(1, 8),
                             "inUse": rng.randint(0, 4)}
    return {"kind": "GPUNode", "metadata": {"name": name, "resourceVersion": str(version)},
            "spec": {"sharing": {"mode": "mps", "replicas": 2}}, "status": status}


def heartbeat(obj: dict[str, Any], version: int, rng: random.Random) -> dict[str, Any]:
    """What an agent's heartbeat changes: the time, the samples, the version."""
    status = dict(obj["status"], heartbeatTime=f"2026-12-01T00:01:{version % 60:02d}Z")
    status["gpus"] = [dict(g, utilization={"gpuPercent": rng.randint(0, 100)}) if isinstance(g, dict) else g
                      for g in status["gpus"]]
    return dict(obj, metadata=dict(obj["metadata"], resourceVersion=str(version)), status=status)


def other(rng: random.Random, kind: str, name: str, version: int) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "resourceVersion": str(version)}
    if kind == "Node":
        meta["labels"] = rng.choice([{}, {"gpupack.io/backend": "dra"}, {"gpupack.io/backend": "device-plugin"},
                                     {"gpupack.io/backend": "bogus"}])
        return {"kind": "Node", "metadata": meta}
    if kind == "Namespace":
        meta["labels"] = rng.choice([{}, {"team": "a"}, {"gpupack.io/backend": "dra"}])
        return {"kind": "Namespace", "metadata": meta}
    modes = rng.choice([["mig"], ["mps", "time-slicing"], ["bogus"]])  # bogus: does not validate, skipped
    return {"kind": "SharingPolicy", "metadata": dict(meta, generation=version),
            "spec": {"namespaces": [{"names": [f"ns{rng.randint(0, 3)}"], "allowedModes": modes}]}}


KINDS = ("GPUNode", "GPUNode", "GPUNode", "Node", "Namespace", "SharingPolicy")


@pytest.mark.parametrize("seed", range(8))
def test_random_changes_one_at_a_time_equal_a_build_from_scratch(seed: int) -> None:
    rng = random.Random(seed)
    parts = InventoryParts()
    live: dict[tuple[str, str], dict[str, Any]] = {}
    before = parts.snapshot(synced=True, version=1)
    version = 0
    for step in range(300):
        version += 1
        kind = rng.choice(KINDS)
        name = f"n{rng.randint(0, 7)}" if kind != "Namespace" else f"ns{rng.randint(0, 3)}"
        key, action = (kind, name), rng.random()
        if key in live and action < 0.2:
            changed = parts.delete(live.pop(key))
        elif key in live and kind == "GPUNode" and action < 0.6:
            live[key] = heartbeat(live[key], version, rng)
            changed = parts.put(live[key])
            assert not changed, "a heartbeat changes nothing an inventory holds"
        elif key in live and action < 0.7:
            changed = parts.put(live[key])  # the same version again (a re-list): nothing to read
        else:
            live[key] = gpunode(rng, name, version) if kind == "GPUNode" else other(rng, kind, name, version)
            changed = parts.put(live[key])
        # The objects in a shuffled order: the build from scratch must not depend on it either.
        objects = list(live.values())
        rng.shuffle(objects)
        expected = build_inventory(objects, synced=True, version=step)
        got = parts.snapshot(synced=True, version=step)
        assert got == expected, f"step {step}"
        # ... and the change is reported exactly when the snapshot's content moved.
        assert changed == (replace(got, version=0) != replace(before, version=0)), f"step {step}"
        before = got


def test_a_put_says_whether_the_inventory_changed() -> None:
    rng = random.Random(1)
    parts = InventoryParts()
    obj = gpunode(rng, "a", 1)
    while not obj["status"]["gpus"]:
        obj = gpunode(rng, "a", 1)
    assert parts.put(obj) and parts.reads == 1
    assert not parts.put(obj) and parts.reads == 1  # the version already read: not even read
    assert not parts.put(heartbeat(obj, 2, rng)) and parts.reads == 2  # read, and equal
    first = parts.snapshot(synced=True, version=1)
    assert all(g.gpu_percent is None for n in first.nodes for g in n.gpus)  # no samples: heartbeats move them
    gpus = [dict(g, migEnabled=False, instances=[]) for g in obj["status"]["gpus"] if isinstance(g, dict)]
    gpus[0]["memoryMiB"] = 1234
    changed = dict(obj, metadata={"name": "a", "resourceVersion": "3"}, status=dict(obj["status"], gpus=gpus))
    assert parts.put(changed)
    assert parts.snapshot(synced=True, version=2) != first
    # A Node's labels matter only through its pool, and only for a GPUNode of the same name.
    assert not parts.put({"kind": "Node", "metadata": {"name": "b", "labels": {"gpupack.io/backend": "dra"}}})
    assert not parts.put({"kind": "Node", "metadata": {"name": "a", "labels": {"unrelated": "x"}}})
    assert parts.put({"kind": "Node", "metadata": {"name": "a", "labels": {"gpupack.io/backend": "dra"}}})
    assert parts.snapshot(synced=True, version=3).nodes[0].backend == "dra"
    assert parts.delete({"kind": "Node", "metadata": {"name": "a"}})
    assert not parts.delete({"kind": "Node", "metadata": {"name": "a"}})
    assert parts.snapshot(synced=True, version=4).nodes[0].backend == "device-plugin"
    # A policy's generation alone changes nothing an inventory holds.
    policy = other(random.Random(0), "SharingPolicy", "p", 5)
    assert parts.put(policy)
    assert not parts.put(dict(policy, metadata={"name": "p", "resourceVersion": "6", "generation": 6}))


def test_reset_puts_a_fresh_list_and_deletes_what_it_lacks() -> None:
    rng = random.Random(2)
    parts = InventoryParts()
    a, b, c = (gpunode(rng, n, 1) for n in "abc")
    parts.put(a)
    parts.put(b)
    reads = parts.reads
    assert parts.reset("GPUNode", [a, c])
    assert parts.reads == reads + 1  # only c was read: a is at the version already read
    assert parts.snapshot(synced=True, version=0) == build_inventory([a, c])
    assert not parts.reset("GPUNode", [c, a])
    assert parts.reset("Namespace", [{"kind": "Namespace", "metadata": {"name": "x"}}])
    assert parts.reset("Namespace", [])
    assert parts.snapshot(synced=True, version=0) == build_inventory([a, c])
