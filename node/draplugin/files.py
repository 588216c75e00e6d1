"""Crash-safe file writes for the plugin's journal and CDI specs.

A file is written under a temporary name in the same directory, flushed and
fsynced, renamed over its final name, and the directory fsynced: after a crash
or power loss the file holds either its old or its new content, never half of
one, and a rename or removal that returned is on disk. The temporary name ends
in ``.tmp`` and starts with ``.``: the CDI registry reads only ``*.json`` and
``*.yaml`` and the journal only ``*.json``, so neither ever reads a file in the
middle of being written.
"""

from __future__ import annotations

import os
from pathlib import Path

TMP_SUFFIX = ".tmp"


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data``, durably (see the module docstring)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    sync_directory(path.parent)


def remove(path: Path) -> bool:
    """Remove ``path`` durably; False if it was not there."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    sync_directory(path.parent)
    return True


def sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_temporaries(directory: Path, prefix: str) -> int:
    """Remove temporaries a killed writer left in ``directory`` (``.<prefix>*.tmp``); returns how many."""
    removed = 0
    for path in directory.glob(f".{prefix}*{TMP_SUFFIX}"):
        path.unlink(missing_ok=True)
        removed += 1
    return removed
