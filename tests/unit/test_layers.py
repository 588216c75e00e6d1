"""Architecture contracts (ARCHITECTURE.md, STYLE.md #2), checked on the source tree.

* ``mig`` imports nothing of gpupack's other packages, and no Kubernetes, NVML or HTTP.
* ``sharing`` imports only ``mig`` of ours, and no Kubernetes, NVML or HTTP.
* ``webhook``, ``node`` and ``controller`` do not import each other.
* No two of our modules import each other, directly or through others, type-only
  imports (``if TYPE_CHECKING:``) included.
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


def module_graph(root: Path) -> dict[str, set[str]]:
    """Our module -> our modules it imports (any import statement, type-only ones too)."""
    modules: dict[str, Path] = {}
    for package in OURS:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
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
