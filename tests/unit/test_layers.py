"""Architecture contracts (ARCHITECTURE.md, STYLE.md #2), checked on the source tree.

* ``mig`` imports nothing of gpupack's other packages, and no Kubernetes, NVML or HTTP.
* ``sharing`` imports only ``mig`` of ours, and no Kubernetes, NVML or HTTP.
* ``webhook``, ``node`` and ``controller`` do not import each other.
* No two of our modules import each other, directly or through others, type-only
  imports (``if TYPE_CHECKING:``) included.
* Inside each package, rooms (a folder's own files are one room, each sub-folder another)
  import only the rooms ``ROOMS`` lets them, and no rooms import each other at any depth.
* No live component imports the trace simulator (``sharing.simulator``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = {"mig", "sharing", "webhook", "node", "gpupack", "controller", "kube"}
IO_LIBRARIES = {"kubernetes", "kopf", "pynvml", "fastapi", "uvicorn", "starlette", "httpx", "aiohttp", "prometheus_client"}

RULES: dict[str, tuple[set[str], set[str]]] = {
    # package: (our packages it may import, third-party packages it must not import)
    "mig": ({"mig"}, IO_LIBRARIES),
    "sharing": ({"mig", "sharing"}, IO_LIBRARIES),
    "webhook": ({"mig", "sharing", "webhook", "kube"}, {"pynvml"}),
    "node": ({"mig", "sharing", "node", "kube"}, {"fastapi", "starlette", "kopf"}),
    "controller": ({"mig", "sharing", "controller", "kube"}, {"pynvml", "fastapi", "starlette"}),
    # The shared Kubernetes edge: the client library and nothing of ours.
    "kube": ({"kube"}, {"kopf", "pynvml", "fastapi", "starlette"}),
}


def imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def cases() -> list[tuple[str, Path]]:
    found = []
    for package in RULES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found.append((package, path))
    return found


@pytest.mark.parametrize(("package", "path"), cases(), ids=lambda v: str(v.relative_to(ROOT)) if isinstance(v, Path) else v)
def test_module_respects_its_layer(package: str, path: Path) -> None:
    allowed_ours, forbidden = RULES[package]
    imported = imported_top_levels(path)
    wrong_ours = (imported & OURS) - allowed_ours
    wrong_io = imported & forbidden
    assert not wrong_ours, f"{path.relative_to(ROOT)} imports {sorted(wrong_ours)}; {package} may import only {sorted(allowed_ours)}"
    assert not wrong_io, f"{path.relative_to(ROOT)} imports {sorted(wrong_io)}, which {package} must not use"


def test_the_checker_sees_violations(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import kubernetes\nfrom sharing.x import y\nfrom . import z\n")
    assert imported_top_levels(bad) == {"kubernetes", "sharing"}


def our_modules(root: Path) -> dict[str, Path]:
    """Our module's dotted name -> its file (a package's name -> its ``__init__.py``)."""
    modules: dict[str, Path] = {}
    for package in OURS:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def module_graph(root: Path) -> dict[str, set[str]]:
    """Our module -> our modules it imports (any import statement, type-only ones too)."""
    modules = our_modules(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (as a path that returns to its start), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state and (found := visit(name)):
            return found
    return None


def test_no_import_cycles() -> None:
    cycle = import_cycle(module_graph(ROOT))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_sees_a_type_only_cycle(tmp_path: Path) -> None:
    (tmp_path / "mig").mkdir()
    (tmp_path / "mig" / "a.py").write_text("from mig.b import B\n")
    (tmp_path / "mig" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mig.a import A\n")
    (tmp_path / "mig" / "c.py").write_text("import mig.a\n")
    assert import_cycle(module_graph(tmp_path)) == ["mig.a", "mig.b", "mig.a"]


# Rooms (docs/architecture.md, "Layers"): inside a package, a folder's own files are one
# room and each sub-folder is another; a package's ``__init__`` is in its folder's room. The table
# is the architecture, as kopf's import-linter contracts are: per package, each room and the rooms
# of that package it may import (imports between packages are ``RULES``'s). Every room on disk is
# declared, so a new folder states its place before it is used.
ROOMS: dict[str, dict[str, set[str]]] = {
    "mig": {
        "mig": set(),  # MIG geometry: the GPU catalog, fit checks, layouts, mig-parted configs
    },
    "kube": {
        "kube": set(),  # the one Kubernetes edge: client, errors, retries, settings, times
    },
    "webhook": {
        "webhook": set(),  # the FastAPI admission app around sharing.admission
    },
    "sharing": {
        "sharing": set(),  # the package alone (its docstring)
        "sharing.api": set(),  # wire types: keys, CRD models, GPUNode and allocation readers, records
        "sharing.rules": {"sharing.api"},  # rules every component applies: replicas, windows, node policy
        "sharing.packing": {"sharing.api", "sharing.rules"},  # the packing engine: cluster model, scoring
        "sharing.dra": {"sharing.api", "sharing.rules", "sharing.packing"},  # the DRA device model
        # the webhook's decision core: request -> options -> decision -> patch, and its inventory
        "sharing.admission": {"sharing.api", "sharing.rules", "sharing.packing", "sharing.dra"},
        # use, not only requests: usage traces, the recommender and right-sizing, pure (issue 35)
        # (it places shares through the packing engine's shared-GPU pool, sharing/packing/shared_gpus.py)
        "sharing.usage": {"sharing.api", "sharing.rules", "sharing.packing"},
        # trace simulator and product model: drives the rooms above, never imported by live code
        "sharing.simulator": {"sharing.api", "sharing.rules", "sharing.packing", "sharing.dra", "sharing.admission",
                              "sharing.usage"},
    },
    "controller": {
        "controller.state": set(),  # the cycle's snapshot types and building them from API objects
        "controller.planning": {"controller.state"},  # pure planning of one cycle
        "controller.writes": {"controller.state", "controller.planning"},  # pure patch and object builders
        # kopf handlers, watch caches and the cycle's I/O
        "controller": {"controller.state", "controller.planning", "controller.writes"},
    },
    "node": {
        "node.kubeletapi": set(),  # generated gRPC stubs of the kubelet's APIs
        "node.nvml": set(),  # NVML backends: the real one and the simulation
        # what the agent's parts share: the context protocol and its types (idle clocks, reshape rules
        # among them), operator and emulator protocols
        "node.base": {"node.nvml"},
        "node.draplugin": {"node.base", "node.nvml", "node.kubeletapi"},  # the DRA kubelet plugin
        "node.health": {"node.base", "node.nvml"},  # GPU faults: signals, XID table, tracker, monitor
        "node.layouts": {"node.base", "node.nvml"},  # how a layout reaches the GPU: NVML or mig-manager
        "node.advertising": {"node.base", "node.nvml", "node.draplugin"},  # how GPUs reach the kubelet
        "node.usage": {"node.base", "node.nvml"},  # what each pod uses of the GPUs: samples, attribution
        # the agent: its loop, metrics, who owns a device, and the wiring of its parts
        "node": {"node.kubeletapi", "node.nvml", "node.base", "node.draplugin", "node.health", "node.layouts",
                 "node.advertising", "node.usage"},
    },
    "gpupack": {
        "gpupack.testing": set(),  # builders for the tests and benchmarks, for no command
        "gpupack.devcluster": set(),  # a real local control plane (etcd, kube-apiserver, scheduler, KWOK)
        "gpupack.fleet": set(),  # SIMULATION: many nodes' agents in one process
        "gpupack.demo": {"gpupack.devcluster"},  # ``gpupack demo``: the whole system on simulated nodes
        "gpupack.replay": {"gpupack.devcluster", "gpupack.demo"},  # ``gpupack replay``: a trace on KWOK nodes
        # the command line: wires the commands above
        "gpupack": {"gpupack.devcluster", "gpupack.fleet", "gpupack.demo", "gpupack.replay"},
    },
}

# Imports the table forbids that are known, each with the change that removes it. The test fails
# when one is no longer made, so this list only shrinks. Empty since the agent's reshape rules became
# one gate in ``sharing/rules`` and what the agent keeps of them moved into ``node.base`` (issue 34).
KNOWN_EDGES: set[tuple[str, str]] = set()  # (importing room, imported module)

SIMULATOR = "sharing.simulator"
LIVE = {"mig", "kube", "webhook", "node", "controller", "sharing"}
"""Packages whose every room is live code: none may import ``SIMULATOR`` (which is in ``sharing``)."""

Edges = dict[tuple[str, str], set[tuple[str, str]]]


def within(room: str, top: str) -> bool:
    return room == top or room.startswith(top + ".")


def rooms_on_disk(root: Path) -> set[str]:
    return {".".join(path.relative_to(root).parent.parts) for path in our_modules(root).values()}


def room_edges(root: Path) -> Edges:
    """(importing room, imported room) -> the (module, imported module) imports that make the edge."""
    room = {name: ".".join(path.relative_to(root).parent.parts) for name, path in our_modules(root).items()}
    edges: Edges = {}
    for name, targets in module_graph(root).items():
        for target in targets:
            if room[name] != room[target]:
                edges.setdefault((room[name], room[target]), set()).add((name, target))
    return edges


def table_violations(edges: Edges, table: dict[str, dict[str, set[str]]], known: set[tuple[str, str]]) -> list[str]:
    """Imports from one room to another of its package that ``table`` does not allow (``known`` aside)."""
    found = []
    for (source, target_room), imports in sorted(edges.items()):
        package = source.split(".")[0]
        allowed = table.get(package, {}).get(source, set())
        if target_room.split(".")[0] != package or target_room in allowed:
            continue
        found += [f"{module} imports {target}: {source} may import {sorted(allowed)} of {package}"
                  for module, target in sorted(imports) if (source, target) not in known]
    return found


def room_cycle(edges: Edges, depth: int, known: set[tuple[str, str]]) -> list[str] | None:
    """A circle between rooms seen ``depth`` folders deep (deeper rooms count as their folder at that
    depth: 1 is the packages), not counting ``known`` imports; None if there is none."""
    graph: dict[str, set[str]] = {}
    for (source, target_room), imports in edges.items():
        a, b = (".".join(room.split(".")[:depth]) for room in (source, target_room))
        graph.setdefault(a, set())
        graph.setdefault(b, set())
        if a != b and any((source, target) not in known for _, target in imports):
            graph[a].add(b)
    return import_cycle(graph)


def simulator_imports(edges: Edges) -> list[str]:
    return [f"{module} imports {target}" for (source, target_room), imports in sorted(edges.items())
            if within(target_room, SIMULATOR) and not within(source, SIMULATOR) and source.split(".")[0] in LIVE
            for module, target in sorted(imports)]


def unused_known_edges(edges: Edges, known: set[tuple[str, str]]) -> set[tuple[str, str]]:
    made = {(source, target) for (source, _), imports in edges.items() for _, target in imports}
    return known - made


@pytest.fixture(scope="module")
def edges() -> Edges:
    return room_edges(ROOT)


def test_every_room_is_declared_and_every_declared_room_exists() -> None:
    declared = {room for rooms in ROOMS.values() for room in rooms}
    assert rooms_on_disk(ROOT) - declared == set(), "declare the new folder in ROOMS: what it holds, what it may import"
    assert declared - rooms_on_disk(ROOT) == set(), "remove the folder that is gone from ROOMS"
    for package, rooms in ROOMS.items():
        for room, allowed in rooms.items():
            assert within(room, package) and room not in allowed and allowed <= set(rooms), room


def test_rooms_import_only_what_the_table_allows(edges: Edges) -> None:
    assert table_violations(edges, ROOMS, KNOWN_EDGES) == []


def test_no_circle_between_rooms_at_any_depth(edges: Edges) -> None:
    deepest = max(len(room.split(".")) for room in rooms_on_disk(ROOT))
    cycles = {depth: cycle for depth in range(1, deepest + 1) if (cycle := room_cycle(edges, depth, KNOWN_EDGES))}
    assert cycles == {}, "rooms import each other (depth: circle)"


def test_no_live_component_imports_the_simulator(edges: Edges) -> None:
    assert simulator_imports(edges) == []


def test_every_known_edge_is_still_made(edges: Edges) -> None:
    assert unused_known_edges(edges, KNOWN_EDGES) == set(), "the import is gone: remove it from KNOWN_EDGES"


def test_the_room_checks_see_violations(tmp_path: Path) -> None:
    files = {
        "node/__init__.py": "",
        "node/agent.py": "from node.parts.act import act\n",
        "node/policy.py": "",
        "node/parts/__init__.py": "",
        # up into the agent (a circle), and to a module the test allows
        "node/parts/act.py": "from node.agent import Agent\nfrom node.policy import Rules\n",
        "sharing/__init__.py": "",
        "sharing/api/__init__.py": "",
        "sharing/api/keys.py": "from sharing.simulator.run import replay\n",  # live code into the simulator
        "sharing/simulator/__init__.py": "",
        "sharing/simulator/run.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    table = {"node": {"node": {"node.parts"}, "node.parts": set()},
             "sharing": {"sharing": set(), "sharing.api": set(), SIMULATOR: {"sharing.api"}}}
    known = {("node.parts", "node.policy"), ("node.parts", "node.gone")}
    found = room_edges(tmp_path)
    assert rooms_on_disk(tmp_path) == {"node", "node.parts", "sharing", "sharing.api", SIMULATOR}
    assert table_violations(found, table, known) == [
        "node.parts.act imports node.agent: node.parts may import [] of node",
        "sharing.api.keys imports sharing.simulator.run: sharing.api may import [] of sharing",
    ]
    assert room_cycle(found, 1, known) is None
    assert room_cycle(found, 2, known) == ["node", "node.parts", "node"]
    assert room_cycle(found, 2, known | {("node.parts", "node.agent")}) is None
    assert simulator_imports(found) == ["sharing.api.keys imports sharing.simulator.run"]
    assert unused_known_edges(found, known) == {("node.parts", "node.gone")}


# Keys may be spelled only where they are defined: ``sharing/api/keys.py`` (and ``mig/model.py``
# for the MIG resource prefix, below ``sharing``). The emulator writes the GFD labels nothing
# of gpupack reads, as GPU feature discovery would, so it spells those itself.
KEY_PREFIXES = ("gpupack.io/", "nvidia.com/", "kubernetes.io/")
KEY_HOMES = {"sharing/api/keys.py", "mig/model.py", "node/base/device_plugin_emulator.py"}
NOT_KEYS = {"gpupack.io/v1alpha1"}  # the API version, defined with the CRD models


def spelled_keys(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            and node.value.startswith(KEY_PREFIXES) and node.value not in NOT_KEYS]


@pytest.mark.parametrize("package", sorted(RULES))
def test_labels_annotations_and_resources_are_spelled_in_one_module(package: str) -> None:
    spelled = {
        str(path.relative_to(ROOT)): keys
        for path in sorted((ROOT / package).rglob("*.py"))
        if str(path.relative_to(ROOT)) not in KEY_HOMES and (keys := spelled_keys(path))
    }
    assert spelled == {}, "use the names in sharing/api/keys.py"


def test_spelled_keys_finds_a_literal(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('"""Mentions gpupack.io/gpu-milli in prose."""\nKEY = "gpupack.io/gpu-milli"\n')
    assert spelled_keys(sample) == ["gpupack.io/gpu-milli"]
