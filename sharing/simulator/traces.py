"""Reading the openb trace CSVs into engine types, with errors that name file and line.

Node list columns: ``sn, cpu_milli, memory_mib, gpu, model``. Pod list columns:
``name, cpu_milli, memory_mib, num_gpu, gpu_milli`` and optionally ``gpu_spec``,
``creation_time``, ``deletion_time`` (other columns are ignored); :func:`load_qos` reads the
``qos`` column where a trace has one (the multigpu traces do not). Request
conversion follows the published simulator (``PROTOCOL.md`` §1): ``gpu_milli``
is clamped to 0..1000, a pod with no GPUs (or no GPU milli) is CPU-only, and
``gpu_spec`` is split on ``|`` with empty parts dropped.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from sharing.packing.specs import GPU_MILLI, NodeSpec, PodSpec
from sharing.packing.typical import parse_gpu_spec

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


class TraceError(ValueError):
    """A trace file is missing or malformed; the message names file, line and problem."""


@dataclass(frozen=True)
class PodTrace:
    """One pod list: pods in file order, with their creation/deletion times (seconds; None if absent)."""

    workload: str
    pods: tuple[PodSpec, ...]
    created: tuple[int | None, ...]
    deleted: tuple[int | None, ...]


def workload_name(path: Path) -> str:
    """``openb_pod_list_default.csv`` -> ``openb_pod_list_default`` (the reference table's key)."""
    return path.name.removesuffix(".csv")


def _rows(path: Path, required: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            missing = [c for c in required if c not in header]
            if missing:
                raise TraceError(
                    f"{path}:1: missing column(s) {', '.join(missing)}; expected at least {', '.join(required)}"
                )
            out = []
            for row in reader:
                if None in row or any(v is None for v in row.values()):
                    raise TraceError(f"{path}:{reader.line_num}: expected {len(header)} fields")
                out.append((reader.line_num, row))
            return out
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    except csv.Error as exc:
        raise TraceError(f"{path}: malformed CSV ({exc})") from exc


def _int(path: Path, line: int, row: dict[str, str], column: str, *, minimum: int | None = 0) -> int:
    text = row[column].strip()
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{path}:{line}: column {column!r} must be a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")) or value != int(value):
        raise TraceError(f"{path}:{line}: column {column!r} must be a whole number, got {text!r}")
    if minimum is not None and value < minimum:
        raise TraceError(f"{path}:{line}: column {column!r} must be >= {minimum}, got {text!r}")
    return int(value)


def _optional_int(path: Path, line: int, row: dict[str, str], column: str) -> int | None:
    if column not in row or not row[column].strip():
        return None
    return _int(path, line, row, column, minimum=None)


def _unique_name(path: Path, line: int, row: dict[str, str], column: str, what: str, seen: set[str]) -> str:
    """The row's ``column`` as a name: not empty and not seen before in this file."""
    name = row[column].strip()
    if not name:
        raise TraceError(f"{path}:{line}: empty {what} name (column {column!r})")
    if name in seen:
        raise TraceError(f"{path}:{line}: duplicate {what} name {name!r}")
    seen.add(name)
    return name


def load_nodes(path: Path) -> tuple[NodeSpec, ...]:
    """GPU nodes of a node list CSV, in file order."""
    nodes = []
    seen: set[str] = set()
    for line, row in _rows(path, NODE_COLUMNS):
        name = _unique_name(path, line, row, "sn", "node", seen)
        gpus = _int(path, line, row, "gpu")
        model = row["model"].strip()
        if gpus and not model:
            raise TraceError(f"{path}:{line}: node {name!r} has {gpus} GPUs but no model")
        nodes.append(
            NodeSpec(
                name=name,
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                gpu_count=gpus,
                gpu_model=model,
            )
        )
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    return tuple(nodes)


def load_qos(path: Path) -> dict[str, str] | None:
    """Each pod's ``qos`` value by name, or None when the pod list has no ``qos`` column; an empty value
    is a TraceError naming the line (openb gives every pod one)."""
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    with path.open(newline="", encoding="utf-8", errors="replace") as fh:
        header = next(csv.reader(fh), [])
    if "qos" not in header:
        return None
    rows = _rows(path, ("name", "qos"))
    out: dict[str, str] = {}
    for line, row in rows:
        qos = row["qos"].strip()
        if not qos:
            raise TraceError(f"{path}:{line}: empty qos for pod {row['name'].strip()!r}")
        out[row["name"].strip()] = qos
    return out


def load_pods(path: Path) -> PodTrace:
    """Pods of a pod list CSV, in file order (the simulator sorts them by name)."""
    pods, created, deleted = [], [], []
    seen: set[str] = set()
    for line, row in _rows(path, POD_COLUMNS):
        name = _unique_name(path, line, row, "name", "pod", seen)
        count = _int(path, line, row, "num_gpu")
        milli = min(max(_int(path, line, row, "gpu_milli", minimum=None), 0), GPU_MILLI)
        if count == 0 or milli == 0:
            count, milli, spec = 0, 0, ""
        else:
            spec = (row.get("gpu_spec") or "").strip()
            if spec.lower() == "nan":
                spec = ""
            if count > 1 and milli != GPU_MILLI:
                raise TraceError(f"{path}:{line}: a {count}-GPU pod must ask 1000 gpu_milli, got {milli}")
        pods.append(
            PodSpec(
                name=name,
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                gpu_count=count,
                gpu_milli=milli,
                gpu_models=parse_gpu_spec(spec),
                gpu_spec=spec,
            )
        )
        created.append(_optional_int(path, line, row, "creation_time"))
        deleted.append(_optional_int(path, line, row, "deletion_time"))
    if not pods:
        raise TraceError(f"{path}: no pods")
    return PodTrace(workload=workload_name(path), pods=tuple(pods), created=tuple(created), deleted=tuple(deleted))
