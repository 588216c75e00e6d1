"""The plugin killed at every step of a prepare and of an unprepare, then restarted.

A step is every NVML call (before it and after it took effect), every journal
write and removal, and every CDI spec write and removal (before and after each). For each
step in turn the plugin is killed there; a new process (a new simulated NVML
read from the state file, a new engine reading the journal) recovers, and then:

1. no MIG instance is left that no prepared claim holds (nothing leaks), and an
   instance the claim did not create is never destroyed;
2. the claim is either ``Prepared`` (a kill after it was done) or gone from the
   journal, with its CDI spec present exactly when it is prepared;
3. the kubelet's retry succeeds with the allocated placements, and an unprepare
   after it leaves the GPU as it was before the claim.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from mig.model import Placement
from node.draplugin import cdi
from node.draplugin.claims import ClaimRef
from node.draplugin.journal import ClaimJournal, ClaimRecord
from tests.unit.test_draplugin_prepare import MODEL, Node, make_node, result, share


class Killed(BaseException):
    """The plugin process dies (BaseException: no ``except Exception`` may swallow it)."""


class Steps:
    """Counts steps; raises :class:`Killed` at step ``kill_at`` (0: never)."""

    def __init__(self, kill_at: int = 0) -> None:
        self.kill_at = kill_at
        self.seen: list[str] = []

    def step(self, name: str) -> None:
        self.seen.append(name)
        if len(self.seen) == self.kill_at:
            raise Killed(name)


class KillableJournal(ClaimJournal):
    def __init__(self, directory: Path, steps: Steps) -> None:
        super().__init__(directory)
        self.steps = steps

    def write(self, record: ClaimRecord) -> None:
        self.steps.step(f"journal-before:{record.phase}")
        super().write(record)
        self.steps.step(f"journal-after:{record.phase}")

    def delete(self, uid: str) -> None:
        self.steps.step("journal-delete-before")
        super().delete(uid)
        self.steps.step("journal-delete-after")


def instrument(node: Node, steps: Steps, monkeypatch: pytest.MonkeyPatch) -> None:
    node.sim.hook = lambda operation, gpu, when: steps.step(f"nvml-{operation}-{when}:{gpu}")
    real_write = cdi.write_spec

    def write_spec(cdi_dir: Path, uid: str, spec: dict[str, object]) -> Path:
        steps.step("cdi-before")
        path = real_write(cdi_dir, uid, spec)
        steps.step("cdi-after")
        return path

    real_remove = cdi.remove_spec

    def remove_spec(cdi_dir: Path, uid: str) -> bool:
        steps.step("cdi-remove-before")
        removed = real_remove(cdi_dir, uid)
        steps.step("cdi-remove-after")
        return removed

    monkeypatch.setattr(cdi, "write_spec", write_spec)
    monkeypatch.setattr(cdi, "remove_spec", remove_spec)


# A claim of two MIG placements and a share, on a GPU that already holds an instance nobody claims.
CLAIM = ClaimRef("u1", "ml", "train")
RESULTS = (result("gpu-0-mig-3g-40gb-4"), result("gpu-0-mig-1g-10gb-1", "small"), share(1, "300", "20Gi", "s"))
EXPECTED = [("1g.10gb", 0), ("1g.10gb", 1), ("3g.40gb", 4)]


def setup(directory: Path) -> Node:
    node = make_node(directory)
    node.sim.create_gpu_instance(0, MODEL.profile("1g.10gb").profile_id, Placement(0, 1))  # not ours: stays
    node.claims.add(CLAIM.uid, *RESULTS, name=CLAIM.name)
    return node


def restart(node: Node) -> None:
    node.sim.hook = None
    node.restart_nvml()
    preparer = node.preparer()
    preparer.recover()
    records = preparer.records
    held = {(d.gpu, d.gi_id) for r in records.values() if r.phase == "Prepared" for d in r.devices if d.gi_id}
    for instance in node.sim.gpu_instances(0):
        assert instance.placement == Placement(0, 1) or (0, instance.gi_id) in held, f"leaked {instance.placed}"
    assert node.instances()[0] == ("1g.10gb", 0), "an instance the claim did not create was destroyed"
    assert set(records) <= {CLAIM.uid} and all(r.phase == "Prepared" for r in records.values())
    assert cdi.spec_path(node.cdi_dir, CLAIM.uid).exists() == (CLAIM.uid in records)


def count_steps(directory: Path, action: Callable[[Node, ClaimJournal], None],
                monkeypatch: pytest.MonkeyPatch) -> int:
    node = setup(directory)
    steps = Steps()
    with monkeypatch.context() as patch:
        instrument(node, steps, patch)
        action(node, KillableJournal(node.journal_dir, steps))
    return len(steps.seen)


def prepare(node: Node, journal: ClaimJournal | None = None) -> None:
    node.preparer(journal).prepare(CLAIM)


def prepare_then_unprepare(node: Node, journal: ClaimJournal | None = None) -> None:
    preparer = node.preparer(journal)
    preparer.prepare(CLAIM)
    preparer.unprepare(CLAIM)


@pytest.mark.parametrize("action", [prepare, prepare_then_unprepare], ids=["prepare", "prepare-then-unprepare"])
def test_a_kill_at_any_step_is_recovered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         action: Callable[..., None]) -> None:
    total = count_steps(tmp_path / "count", action, monkeypatch)
    assert total > 20
    for kill_at in range(1, total + 1):
        node = setup(tmp_path / f"kill-{kill_at}")
        steps = Steps(kill_at)
        with monkeypatch.context() as patch:
            instrument(node, steps, patch)
            with pytest.raises(Killed):
                action(node, KillableJournal(node.journal_dir, steps))
        restart(node)
        preparer = node.preparer()
        devices = preparer.prepare(CLAIM)  # the kubelet's retry
        assert [d.device for d in devices] == [r["device"] for r in RESULTS], steps.seen[-1]
        assert node.instances() == EXPECTED, steps.seen[-1]
        preparer.unprepare(CLAIM)
        assert node.instances() == [("1g.10gb", 0)], steps.seen[-1]
        assert node.leftovers() == ([], []), steps.seen[-1]
