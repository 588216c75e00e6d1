"""Reading a file an operator names: bounded in size, type and nesting, refused in one line.

Every file gpupack reads because a flag, an environment variable or a setting names it (an
inventory, a kubeconfig, a mig-parted config, an XID table, a Pod manifest, a state file, a
claims or GPUNode file) is read here, by every component: the CLI at start, the webhook on
each reload of its inventory, the agent and the DRA plugin while they run. So ``/dev/zero``,
``/dev/urandom``, a FIFO, a directory or a file of a few gigabytes is refused with one line
instead of eating memory or waiting forever, and a document nested 100,000 levels deep is
refused before a recursive parser (PyYAML's composer, ``json``) meets it.

* The file is opened with ``O_NONBLOCK``: opening a FIFO with no writer returns at once
  (a blocking open waits for a writer forever).
* ``fstat`` on the open descriptor must say "regular file": character devices, FIFOs,
  sockets and directories are refused, each named.
* At most ``limit + 1`` bytes are read, whatever ``st_size`` says (``/proc`` files report 0),
  and a file over ``limit`` is refused naming the limit and the variable that raises it.
* With ``syntax`` given, the nesting depth of the text is measured without recursion and a
  document deeper than :data:`MAX_DEPTH` is refused.

Refusals are :class:`InputFileError`, an ``OSError`` with ``filename`` and ``strerror`` set,
so every caller that already reports an unreadable file in one line (``gpupack.cli.main``,
the webhook's "reported, skipped; the last good view keeps serving" reload) reports these the
same way. Reading the whole file at once is the point: the inputs here are small documents.
Streamed inputs (the simulator's CSV traces) use :func:`check_regular_file` only.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from itertools import accumulate
from typing import BinaryIO, Literal

import yaml

LIMIT_VARIABLE = "GPUPACK_MAX_INPUT_BYTES"
"""Environment variable that overrides :data:`DEFAULT_LIMIT` (bytes) for every input."""
DEFAULT_LIMIT = 16 * 1024 * 1024
"""16 MiB: an inventory of ten thousand GPUNodes is a few MiB; no input gpupack reads whole is larger."""
MAX_DEPTH = 100
"""Nesting levels a YAML or JSON input may have: real inputs use fewer than 20."""

Syntax = Literal["yaml", "json"]

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


class InputFileError(OSError):
    """A named file that gpupack will not read; ``str()`` is one line naming the file and why."""

    def __init__(self, path: str | os.PathLike[str], why: str, code: int = errno.EINVAL) -> None:
        super().__init__(code, why, os.fspath(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def input_limit() -> int:
    """The size limit in bytes: ``$GPUPACK_MAX_INPUT_BYTES`` when set, else :data:`DEFAULT_LIMIT`."""
    text = os.environ.get(LIMIT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_LIMIT
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{LIMIT_VARIABLE}={text!r} is not a whole number of bytes") from None
    if value <= 0:
        raise ValueError(f"{LIMIT_VARIABLE}={text!r} must be greater than 0")
    return value


def _describe_limit(limit: int) -> str:
    size = f"{limit // (1024 * 1024)} MiB" if limit % (1024 * 1024) == 0 else f"{limit} bytes"
    return f"larger than the {size} limit for an input file (set {LIMIT_VARIABLE} to raise it)"


def _open_regular(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    """An open descriptor of ``path`` and its stat; refuses anything but a regular file."""
    # O_NONBLOCK: a FIFO with no writer opens at once instead of blocking; O_NOCTTY: a terminal
    # named by mistake does not become our controlling terminal.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket, or a device with no driver behind it: say which
            _refuse_unless_regular(path, os.stat(path))
        raise
    try:
        info = os.fstat(fd)
        _refuse_unless_regular(path, info)
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def _refuse_unless_regular(path: str | os.PathLike[str], info: os.stat_result) -> None:
    if not stat.S_ISREG(info.st_mode):
        kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
        code = errno.EISDIR if stat.S_ISDIR(info.st_mode) else errno.EINVAL
        raise InputFileError(path, f"{kind}, not a regular file", code)


def check_regular_file(path: str | os.PathLike[str]) -> None:
    """Refuse ``path`` unless it is a regular file (for inputs read as a stream, any size)."""
    fd, _info = _open_regular(path)
    os.close(fd)


def read_bytes(path: str | os.PathLike[str], *, limit: int | None = None) -> bytes:
    """The bytes of the regular file ``path``, refused when over ``limit`` (default :func:`input_limit`)."""
    limit = input_limit() if limit is None else limit
    fd, info = _open_regular(path)
    try:
        if info.st_size > limit:
            raise InputFileError(path, _describe_limit(limit), errno.EFBIG)
        chunks: list[bytes] = []
        left = limit + 1  # one byte more than allowed tells "over the limit" from "exactly at it"
        while left > 0:
            chunk = os.read(fd, min(left, 1024 * 1024))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    if left <= 0:
        raise InputFileError(path, _describe_limit(limit), errno.EFBIG)
    return b"".join(chunks)


def read_text(path: str | os.PathLike[str], *, limit: int | None = None, syntax: Syntax | None = None) -> str:
    """The UTF-8 text of ``path`` (see :func:`read_bytes`); with ``syntax``, its nesting checked too."""
    data = read_bytes(path, limit=limit)
    return decode_text(path, data, syntax=syntax)


def decode_text(source: str | os.PathLike[str], data: bytes, *, syntax: Syntax | None = None) -> str:
    """``data`` (read from ``source``, a path or a name such as ``<stdin>``) as UTF-8 text, nesting checked."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(source, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if syntax is not None and (problem := nesting_problem(text, syntax)):
        raise InputFileError(source, problem)
    return text


def nesting_problem(text: str, syntax: Syntax) -> str | None:
    """Why ``text`` is nested too deep to parse, or None: for YAML/JSON that arrives other than as a
    file (a ConfigMap's key), checked with the same rule before it reaches a recursive parser."""
    depth = nesting_depth(text, syntax)
    return f"{syntax.upper()} nested {depth} levels deep; at most {MAX_DEPTH} are read" if depth > MAX_DEPTH else None


def read_stream(stream: BinaryIO, name: str, *, limit: int | None = None, syntax: Syntax | None = None) -> str:
    """Text from a binary stream such as ``sys.stdin.buffer``, bounded and checked like a file."""
    limit = input_limit() if limit is None else limit
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise InputFileError(name, _describe_limit(limit), errno.EFBIG)
    return decode_text(name, data, syntax=syntax)


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_JSON_BRACKETS = re.compile(r"[\[\]{}]")


def nesting_depth(text: str, syntax: Syntax) -> int:
    """The deepest nesting of collections in ``text``, measured without recursion.

    JSON: brackets outside strings, counted. YAML: the start and end events of PyYAML's
    parser, which is a state machine (its composer, which builds the document, recurses
    once per level: that is what a deep document breaks). Text that does not parse is given
    the depth reached before the error: the caller's parser reports the error itself."""
    if syntax == "json":
        steps = (1 if bracket in "[{" else -1 for bracket in _JSON_BRACKETS.findall(_JSON_STRING.sub("", text)))
        return max(accumulate(steps, initial=0))
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when installed: faster
    depth = deepest = 0
    try:
        for event in yaml.parse(text, Loader=loader):
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                depth += 1
                if depth > deepest:
                    deepest = depth
                    if deepest > MAX_DEPTH:
                        break  # deep enough to refuse: no need to read the rest
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                depth -= 1
    except yaml.YAMLError:
        pass
    return deepest
