"""Crash-at-every-step property tests of the MIG reconciler on the simulated NVML.

Each example draws a starting layout, the busy instances (processes, which NVML
itself protects, and pods without a process yet, which only the agent protects),
a desired layout, injected NVML faults, workloads that start in the middle of the
reconfiguration, and a set of moments at which the agent is killed. Killing
happens inside NVML calls (before and after they take effect) and around every
journal write. After each kill a fresh agent (new backend object reading the same
state file, same journal store) takes over. Invariants checked:

1. no instance with a pod or a process is ever destroyed, and all are still there
   at the end;
2. the GPU ends in the target layout (``Succeeded``) or the previous one
   (``RolledBack``), or the journal says ``Failed`` with a reason — never in
   between silently.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mig.catalog import get_model
from mig.geometry import fits
from mig.model import GpuModel, PlacedInstance
from node.base.journal import Journal
from node.layouts.mig_loop import GpuDriver, GpuTarget, StartRules
from node.nvml import errors
from node.nvml.protocol import GpuInstance
from node.nvml.simulated import Fault, SimulatedNvml
from node.base.idle_tracking import IdleTracker
from node.layouts.reconciler import MigReconciler, finish

MODELS = [get_model("H200"), get_model("A30")]
PERMANENT_CODES = (errors.NOT_SUPPORTED, errors.RESET_REQUIRED)
TRANSIENT_CODES = (errors.INSUFFICIENT_RESOURCES, errors.UNKNOWN, errors.TIMEOUT)


class Killed(BaseException):
    """The agent process dies (BaseException: no ``except Exception`` may swallow it)."""


@dataclass
class World:
    """What outlives an agent process: the GPU (state file), the API server (journal), workloads."""

    model: GpuModel
    path: Path
    kill_at: frozenset[int]
    pod_at_save: int | None
    """A pod is handed a to-be-changed instance at this journal write of an active journal."""
    process_at_call: int | None
    """A process starts in a to-be-changed instance at this NVML call during an active journal."""
    faults: list[Fault]
    journal: Journal | None = None
    pods: set[PlacedInstance] = field(default_factory=set)
    ever_busy: set[PlacedInstance] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)
    ticks: int = 0
    active_saves: int = 0
    active_calls: int = 0
    now: float = 0.0
    next_pid: int = 1000

    def tick(self, sim: SimulatedNvml, at_save: bool) -> None:
        self.ticks += 1
        self.now += 1.0
        if self.journal is not None and self.journal.active:
            if at_save:
                self.active_saves += 1
                if self.active_saves == self.pod_at_save:
                    self._start_workload(sim, "pod", at_save)
            else:
                self.active_calls += 1
                if self.active_calls == self.process_at_call:
                    self._start_workload(sim, "process", at_save)
        if self.ticks in self.kill_at:
            raise Killed(self.ticks)

    def _start_workload(self, sim: SimulatedNvml, kind: str, at_save: bool) -> None:
        assert self.journal is not None
        present = {i.placed: i for i in sim.gpu_instances(0)}
        candidates = [i for i in self.journal.destroy + self.journal.create if i in present and i not in self.ever_busy]
        if not candidates:
            return
        victim = candidates[0]
        if kind == "pod" and at_save:
            # The device plugin is paused during a reconfiguration; a pod can only
            # have been handed an instance before, i.e. between the agent's steps.
            self.pods.add(victim)
            self.ever_busy.add(victim)
        elif kind == "process":
            sim.start_process(0, self.next_pid, 512, present[victim].gi_id)
            self.next_pid += 1
            self.ever_busy.add(victim)


class Store:
    def __init__(self, world: World, sim: SimulatedNvml) -> None:
        self.world, self.sim = world, sim

    def save(self, journal: Journal) -> None:
        self.world.tick(self.sim, at_save=True)
        self.world.journal = journal
        self.world.tick(self.sim, at_save=True)


class CheckedSim(SimulatedNvml):
    """The simulated NVML with a referee: destroying an instance a pod holds is a violation."""

    world: World

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        placed = next(i.placed for i in self.gpu_instances(index) if i.gi_id == gi_id)
        super().destroy_gpu_instance(index, gi_id)
        if placed in self.world.pods or placed in self.world.ever_busy:
            self.world.violations.append(f"destroyed busy instance {placed}")


def agent_life(world: World, desired: tuple[str, ...], generation: int = 1) -> None:
    sim = CheckedSim(world.model, 1, world.path)
    sim.world = world
    for fault in world.faults:
        if fault.times > 0:
            sim.inject_fault(fault)
    sim.hook = lambda _op, _index, _when: world.tick(sim, at_save=False)
    store = Store(world, sim)

    def busy(index: int, instances: tuple[GpuInstance, ...]) -> frozenset[PlacedInstance]:
        with_process = {p.gi_id for p in sim.processes(index)}
        return frozenset(i.placed for i in instances if i.gi_id in with_process or i.placed in world.pods)

    reconciler = MigReconciler(sim, store, busy, lambda: world.now, max_errors=4)
    uuid = sim.device_info(0).uuid
    driver = GpuDriver(reconciler, sim, busy, IdleTracker())
    target = GpuTarget(world.model, 0, uuid, generation, desired)
    for _ in range(10):
        result = driver.drive(target, world.journal, StartRules(idle_seconds=0.0, retry_seconds=1e9), world.now)
        journal = result.journal
        if journal is not None and journal.phase == "Advertising":
            store.save(finish(journal, world.now))
            continue
        if journal is None or not journal.active:
            if result.decision is None or result.decision.kind != "start":
                return


def _grow_layout(data: st.DataObject, model: GpuModel, label: str) -> list[str]:
    names: list[str] = []
    for _ in range(data.draw(st.integers(0, model.compute_slices), label=f"{label}-size")):
        name = data.draw(st.sampled_from(model.profile_names), label=label)
        if fits(model, [*names, name]) is not None:
            names.append(name)
    return names


def _iter_lives(world: World, desired: tuple[str, ...], generation: int = 1) -> Iterator[int]:
    for life in range(12):
        try:
            agent_life(world, desired, generation)
            return
        except Killed:
            yield life


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_kill_at_any_step_never_destroys_busy_and_never_ends_in_between(data: st.DataObject) -> None:
    model = data.draw(st.sampled_from(MODELS), label="model")
    initial_names = _grow_layout(data, model, "initial")
    desired = tuple(_grow_layout(data, model, "desired"))
    faults = data.draw(st.lists(st.builds(
        Fault,
        operation=st.sampled_from(["create", "destroy"]),
        code=st.sampled_from(TRANSIENT_CODES + PERMANENT_CODES),
        times=st.integers(1, 2),
        after_effect=st.booleans(),
    ), max_size=2), label="faults")
    kill_at = frozenset(data.draw(st.lists(st.integers(1, 60), max_size=4), label="kill_at"))
    pod_at_save = data.draw(st.none() | st.integers(1, 8), label="pod_at_save")
    process_at_call = data.draw(st.none() | st.integers(1, 16), label="process_at_call")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gpus.json"
        setup = SimulatedNvml(model, 1, path)
        placed = fits(model, initial_names)
        assert placed is not None
        gi_of: dict[PlacedInstance, int] = {}
        for instance in placed:
            gi_of[instance] = setup.create_gpu_instance(
                0, model.profile(instance.profile).profile_id, instance.placement).gi_id
        world = World(model, path, kill_at, pod_at_save, process_at_call, faults)
        busy_flags = data.draw(st.lists(st.sampled_from(["idle", "idle", "pod", "process"]),
                                        min_size=len(placed), max_size=len(placed)), label="busy")
        for instance, flag in zip(placed, busy_flags, strict=True):
            if flag == "pod":
                world.pods.add(instance)
            elif flag == "process":
                setup.start_process(0, world.next_pid, 256, gi_of[instance])
                world.next_pid += 1
            if flag != "idle":
                world.ever_busy.add(instance)
        lives = list(_iter_lives(world, desired))
        assert len(lives) < 12, "agent never finished"

        final = SimulatedNvml(model, 1, path)
        observed = frozenset(i.placed for i in final.gpu_instances(0))
        assert world.violations == []
        assert world.ever_busy <= observed, "a busy instance disappeared"
        journal = world.journal
        if journal is None:
            assert observed == frozenset(placed), "GPU changed without a journal"
            return
        assert not journal.active, f"journal left in {journal.phase}"
        permanent_fault = any(f.code in PERMANENT_CODES for f in faults)
        event(f"outcome={journal.phase} lives={min(len(lives), 3)}")
        if not faults and pod_at_save is None and process_at_call is None:
            # Kills alone never make a reshape of idle instances fail: it must finish.
            assert journal.phase == "Succeeded", f"{journal.phase}: {journal.reason}"
        if journal.phase == "Succeeded":
            assert observed == frozenset(journal.target)
            assert Counter(i.profile for i in observed) == Counter(desired)
        elif journal.phase == "RolledBack":
            assert observed == frozenset(journal.previous) == frozenset(placed)
        else:
            assert journal.phase == "Failed", f"unexpected {journal.phase}: {journal.reason}"
            assert journal.reason
            new_instance_taken = journal.reason.startswith("cannot roll back") and any(
                i in world.ever_busy for i in journal.create)
            assert permanent_fault or journal.errors >= 4 or new_instance_taken, journal.reason


def test_a_kill_between_destroy_and_journal_write_is_resumed() -> None:
    """A deterministic case: the agent dies right after NVML destroyed the 7g instance."""
    model = get_model("H200")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gpus.json"
        setup = SimulatedNvml(model, 1, path)
        setup.create_gpu_instance(0, model.profile("7g.141gb").profile_id, model.profile("7g.141gb").placements[0])
        world = World(model, path, frozenset(), None, None, [])
        killed: list[str] = []
        original_tick = world.tick

        def tick(sim: SimulatedNvml, at_save: bool) -> None:
            original_tick(sim, at_save)
            if not at_save and not killed and world.journal is not None and "destroyed" not in world.journal.steps[-1]:
                if not sim._gpus[0].instances:  # the destroy has taken effect, the journal does not say so yet
                    killed.append(world.journal.phase)
                    raise Killed

        world.tick = tick  # type: ignore[method-assign]
        lives = list(_iter_lives(world, ("3g.71gb", "3g.71gb")))
        assert lives == [0] and killed == ["Applying"]
        assert world.journal is not None and world.journal.phase == "Succeeded"
        assert any(step.startswith("created 3g.71gb") for step in world.journal.steps)
        final = SimulatedNvml(model, 1, path)
        assert sorted(str(i.placed) for i in final.gpu_instances(0)) == ["3g.71gb@0:4", "3g.71gb@4:4"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_sequences_of_layouts_workloads_faults_and_kills(data: st.DataObject) -> None:
    """Several spec generations in a row on one GPU; workloads come and go between them."""
    model = data.draw(st.sampled_from(MODELS), label="model")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gpus.json"
        SimulatedNvml(model, 1, path)
        world = World(model, path, frozenset(), None, None, [])
        for generation in range(1, data.draw(st.integers(2, 4), label="generations") + 1):
            desired = tuple(_grow_layout(data, model, f"desired-{generation}"))
            step_faults = data.draw(st.lists(st.builds(
                Fault, operation=st.sampled_from(["create", "destroy"]), code=st.sampled_from(TRANSIENT_CODES),
                times=st.just(1), after_effect=st.booleans()), max_size=1), label="faults")
            world.faults.extend(step_faults)
            world.kill_at = frozenset(world.ticks + k for k in data.draw(
                st.lists(st.integers(1, 40), max_size=3), label="kills"))
            world.pod_at_save = data.draw(st.none() | st.integers(1, 8), label="pod_at_save")
            world.process_at_call = data.draw(st.none() | st.integers(1, 16), label="process_at_call")
            world.active_saves = world.active_calls = 0
            before = frozenset(i.placed for i in SimulatedNvml(model, 1, path).gpu_instances(0))
            lives = list(_iter_lives(world, desired, generation))
            assert len(lives) < 12, "agent never finished"
            observed = frozenset(i.placed for i in SimulatedNvml(model, 1, path).gpu_instances(0))
            assert world.violations == []
            assert world.ever_busy <= observed, "a busy instance disappeared"
            journal = world.journal
            if journal is None or journal.generation != generation:
                assert observed == before, "GPU changed without a journal for this generation"
            else:
                assert not journal.active
                if journal.phase == "Succeeded":
                    assert observed == frozenset(journal.target)
                    assert Counter(i.profile for i in observed) == Counter(desired)
                elif journal.phase == "RolledBack":
                    assert observed == before == frozenset(journal.previous)
                else:
                    assert journal.phase == "Failed" and journal.reason
                    assert observed in (before, frozenset(journal.target)) or journal.reason.startswith(
                        "cannot roll back") or journal.errors >= 4, journal.reason
            if data.draw(st.booleans(), label="workloads-end"):
                sim = SimulatedNvml(model, 1, path)
                for proc in sim.processes(0):
                    sim.stop_process(0, proc.pid)
                world.pods.clear()
                world.ever_busy.clear()
