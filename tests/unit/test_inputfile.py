"""kube.inputfile: the one reader of operator-named files refuses what would hang, flood or recurse."""

from __future__ import annotations

import errno
import io
import json
import os
import socket
from pathlib import Path

import pytest
import yaml

from kube.inputfile import (
    DEFAULT_LIMIT,
    LIMIT_VARIABLE,
    MAX_DEPTH,
    InputFileError,
    check_regular_file,
    input_limit,
    nesting_depth,
    read_bytes,
    read_stream,
    read_text,
)


def test_a_regular_file_reads_whole(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_text("a: [1, {b: 2}]\n")
    assert read_text(path, syntax="yaml") == "a: [1, {b: 2}]\n"


def test_a_file_exactly_at_the_limit_reads_and_one_byte_more_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert read_bytes(path, limit=100) == b"x" * 100
    path.write_bytes(b"x" * 101)
    with pytest.raises(InputFileError) as refused:
        read_bytes(path, limit=100)
    assert refused.value.errno == errno.EFBIG
    assert str(refused.value) == f"{path}: larger than the 100 bytes limit for an input file (set {LIMIT_VARIABLE} to raise it)"


def test_a_file_whose_size_says_zero_is_still_bounded_by_what_is_read() -> None:
    # /proc files report st_size 0; the read itself stops at limit + 1 bytes.
    with pytest.raises(InputFileError, match="limit"):
        read_bytes("/proc/self/maps", limit=10)


@pytest.mark.parametrize(("path", "kind"), [("/dev/zero", "a character device"), ("/dev/urandom", "a character device"),
                                            ("/", "a directory")])
def test_devices_and_directories_are_refused_by_kind(path: str, kind: str) -> None:
    with pytest.raises(InputFileError) as refused:
        read_text(path)
    assert str(refused.value) == f"{path}: {kind}, not a regular file"
    with pytest.raises(InputFileError):
        check_regular_file(path)


def test_a_fifo_with_no_writer_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InputFileError, match="a FIFO \\(named pipe\\), not a regular file"):
        read_text(fifo)  # a blocking open would never return: the test would hang here


def test_a_socket_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        with pytest.raises(InputFileError, match="a socket, not a regular file"):
            check_regular_file(path)  # open() of a socket fails with ENXIO: named as a socket all the same


def test_a_missing_file_is_the_usual_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_text(tmp_path / "missing")


def test_binary_is_refused_as_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "b"
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InputFileError, match="not UTF-8 text"):
        read_text(path)


def test_the_limit_is_overridable_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LIMIT_VARIABLE, raising=False)
    assert input_limit() == DEFAULT_LIMIT
    monkeypatch.setenv(LIMIT_VARIABLE, "2048")
    assert input_limit() == 2048
    for bad in ("lots", "0", "-1"):
        monkeypatch.setenv(LIMIT_VARIABLE, bad)
        with pytest.raises(ValueError, match=LIMIT_VARIABLE):
            input_limit()


@pytest.mark.parametrize("syntax", ["yaml", "json"])
def test_a_document_nested_100000_deep_is_refused_before_any_parser_recurses(tmp_path: Path, syntax: str) -> None:
    path = tmp_path / f"deep.{syntax}"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputFileError, match=f"nested .* levels deep; at most {MAX_DEPTH} are read"):
        read_text(path, syntax=syntax)  # type: ignore[arg-type]


@pytest.mark.parametrize("syntax", ["yaml", "json"])
def test_the_depth_limit_is_exact(tmp_path: Path, syntax: str) -> None:
    path = tmp_path / "d"
    path.write_text("[" * MAX_DEPTH + "]" * MAX_DEPTH)
    assert read_text(path, syntax=syntax)  # type: ignore[arg-type]
    path.write_text("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    with pytest.raises(InputFileError):
        read_text(path, syntax=syntax)  # type: ignore[arg-type]


def test_depth_is_measured_as_the_parsers_see_it() -> None:
    doc = {"a": [{"b": {"c": [1, "]]]]{{{{"]}}], "d": "[[[["}
    assert nesting_depth(json.dumps(doc), "json") == 5  # brackets inside strings do not count
    assert nesting_depth(yaml.safe_dump(doc), "yaml") == 5
    assert nesting_depth("a:\n  b:\n    - c: 1\n", "yaml") == 4  # block style counts as flow style does
    assert nesting_depth('"escaped \\" [[[[" ', "json") == 0
    assert nesting_depth("a: [unclosed", "yaml") == 2  # a syntax error is left to the caller's parser


def test_a_stream_is_bounded_like_a_file() -> None:
    assert read_stream(io.BytesIO(b"kind: Pod\n"), "<stdin>", limit=10, syntax="yaml") == "kind: Pod\n"
    with pytest.raises(InputFileError, match="<stdin>: larger than the 10 bytes limit"):
        read_stream(io.BytesIO(b"x" * 11), "<stdin>", limit=10)


# The readers that run while a component serves use the same reader: a bad file is one clear error.

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("bad", ["deep", "oversize"])
def test_the_webhook_keeps_its_last_good_inventory_when_the_file_turns_hostile(
        bad: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from webhook.inventory_source import FileWatch, InventoryHolder, load_file

    monkeypatch.setenv(LIMIT_VARIABLE, "4096")
    path = tmp_path / "inventory.yaml"
    path.write_text("- kind: GPUNode\n  metadata: {name: a}\n")
    holder = InventoryHolder()
    load_file(holder, path)
    watch = FileWatch(holder, path)
    path.write_text(DEEP if bad == "deep" else "- kind: GPUNode\n  metadata: {name: b}\n" + "#" * 5000 + "\n")
    assert watch.check() is False  # reported and skipped (a RecursionError used to escape here)
    assert [node.name for node in holder.current.nodes] == ["a"]


def test_the_webhook_inventory_refuses_a_fifo_in_one_error(tmp_path: Path) -> None:
    from webhook.inventory_source import InventoryError, load_objects

    fifo = tmp_path / "inventory.yaml"
    os.mkfifo(fifo)
    with pytest.raises(InventoryError, match="a FIFO \\(named pipe\\), not a regular file"):
        load_objects(fifo)


def test_the_dra_plugins_files_refuse_a_deep_document(tmp_path: Path) -> None:
    from node.draplugin.claims import ClaimError, ClaimRef
    from node.draplugin.file_claims import FileClaimSource
    from node.draplugin.gpunode_source import FileGpuNodeSource, GpuNodeUnreadable

    path = tmp_path / "deep.yaml"
    path.write_text(DEEP)
    with pytest.raises(GpuNodeUnreadable, match="nested"):
        FileGpuNodeSource(path).read("n1")
    with pytest.raises(ClaimError, match="nested"):
        FileClaimSource(path).get(ClaimRef(namespace="ns", name="c", uid="u"))


def test_the_simulated_nvml_state_file_refuses_a_deep_document(tmp_path: Path) -> None:
    from node.nvml.simulated import simulated_backend

    path = tmp_path / "state.json"
    path.write_text(DEEP)
    with pytest.raises(ValueError, match=f"simulated NVML state file {path}: JSON nested"):
        simulated_backend("H200", 1, path)


def test_the_xid_table_refuses_a_deep_document_from_its_configmap_too() -> None:
    """The agent parses the gpupack-xid-table ConfigMap with the parser check-xid-table uses: a deep
    document is an XidTableError (the table in force stays), not a RecursionError in the agent."""
    from node.health.xids import XidTableError, parse_overrides

    with pytest.raises(XidTableError, match=f"nested .* levels deep; at most {MAX_DEPTH}"):
        parse_overrides(DEEP)
    with pytest.raises(XidTableError, match="entry 0: must be a mapping"):
        parse_overrides("[[[]]]")  # shallow text reaches the usual checks


def test_nesting_problem_names_the_depth() -> None:
    from kube.inputfile import nesting_problem

    assert nesting_problem("a: [1, 2]", "yaml") is None
    assert nesting_problem("[" * 101 + "]" * 101, "json") == f"JSON nested 101 levels deep; at most {MAX_DEPTH} are read"
