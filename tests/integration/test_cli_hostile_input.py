"""Every ``gpupack`` command, fed missing, malformed, binary and out-of-range input, answers with one
clear line and exit code 2: never a traceback, never a hang.

The commands are found by walking the argparse tree, so a new command or option is covered
without editing this file; only the valid values for other required arguments are listed here.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupack.cli import build_parser, main
from webhook.certs import write_self_signed

ROOT = Path(__file__).resolve().parents[2]
NUMERIC_TYPES = {"int", "finite_float", "positive_float", "non_negative_float"}
FILE_INPUTS = {"--kubeconfig", "--inventory", "--state-file", "--tls-cert", "--tls-key", "--nodes", "--pods",
               "file", "pod"}
"""Options and positionals that name a file the command reads."""
LONG_RUNNING = {("demo",), ("dev", "cluster", "up"), ("dev", "cluster", "down"), ("dev", "cluster", "status")}
"""Commands that start or stop real processes: their file-free options are still checked."""


def leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for action in subs:
        for name, sub in action.choices.items():
            yield from leaves(sub, (*path, name))


COMMANDS = list(leaves(build_parser()))
IDS = [" ".join(path) for path, _ in COMMANDS]


def test_the_walk_finds_every_command_group() -> None:
    assert {path[0] for path, _ in COMMANDS} >= {"mig", "simulate", "dev", "webhook", "agent", "controller", "demo"}


@pytest.mark.parametrize(("path", "parser"), COMMANDS, ids=IDS)
def test_help_and_unknown_options(path: tuple[str, ...], parser: argparse.ArgumentParser,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([*path, "--help"])
    assert done.value.code == 0 and "usage:" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main([*path, "--no-such-option"])
    err = capsys.readouterr().err  # unrecognized, or a required argument missing: reported first
    assert done.value.code == 2 and "error:" in err and "Traceback" not in err


NUMERIC = [(path, action.option_strings[0]) for path, parser in COMMANDS for action in parser._actions
           if action.option_strings and action.type is not None and getattr(action.type, "__name__", "") in NUMERIC_TYPES]


@pytest.mark.parametrize(("path", "option"), NUMERIC, ids=[f"{' '.join(p)} {o}" for p, o in NUMERIC])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "ten", ""])
def test_numbers_that_are_not_finite_are_refused(path: tuple[str, ...], option: str, value: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([*path, option, value])
    assert done.value.code == 2
    assert f"argument {option}" in capsys.readouterr().err


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hostile")
    binary = root / "binary.yaml"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe" * 10)
    directory = root / "a-directory"
    directory.mkdir()
    _ca, cert, key = write_self_signed(root / "tls", "gpupack-webhook", "gpupack-system", [])
    pod = root / "pod.yaml"
    pod.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n"
                   "  - {name: c, image: x, resources: {limits: {gpupack.io/gpu-milli: '100'}}}\n")
    claims = root / "claims.yaml"
    claims.write_text("[]\n")
    return {"binary": binary, "missing": root / "missing" / "nothing.yaml", "directory": directory,
            "cert": cert, "key": key, "pod": pod, "claims": claims}


def valid_rest(path: tuple[str, ...], inputs: dict[str, Path]) -> dict[str, str]:
    """Plausible values for the arguments a command requires besides the one under test."""
    inventory = str(ROOT / "examples" / "inventory.yaml")
    return {
        ("simulate",): {"--policy": "FGD"},
        ("webhook", "serve"): {"--tls-cert": str(inputs["cert"]), "--tls-key": str(inputs["key"]),
                               "--inventory": inventory},
        ("webhook", "decide"): {"--inventory": inventory, "pod": str(inputs["pod"])},
        ("agent", "run"): {"--node": "n1", "--simulate": "H200:1"},
        ("agent", "snapshot"): {"--simulate": "H200:1"},
        ("agent", "inventory"): {"--simulate": "H200:1"},
        ("agent", "fault"): {"kind": "xid", "--gpu": "0", "--xid": "79"},
        ("agent", "health", "ack"): {"--node": "n1", "--gpu": "0"},
        ("agent", "health", "show"): {"--node": "n1"},
    }.get(path, {})


# An option of a file name takes a string; `usage`'s --pods is a count of a trace's pods (an int), not a file.
FILES = [(path, name) for path, parser in COMMANDS if path not in LONG_RUNNING for action in parser._actions
         for name in (action.option_strings or [action.dest]) if name in FILE_INPUTS and action.type is not int]


def positional_values(args: dict[str, str]) -> list[str]:
    return [value for key, value in args.items() if not key.startswith("--")]


SERVERS = {("webhook", "serve"), ("agent", "run"), ("controller", "run")}
"""Run in a child process with a timeout: a regression that starts serving must fail, not hang."""


@pytest.mark.parametrize(("path", "name"), FILES, ids=[f"{' '.join(p)} {n}" for p, n in FILES])
@pytest.mark.parametrize("kind", ["binary", "missing", "directory"])
def test_unusable_files_get_one_line_and_exit_2(path: tuple[str, ...], name: str, kind: str, inputs: dict[str, Path],
                                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    args = dict(valid_rest(path, inputs))
    if name == "--kubeconfig":
        args.pop("--inventory", None)  # with an inventory file the webhook never reads credentials
    args[name] = str(inputs[kind])
    if name in ("--nodes", "--pods") or path == ("simulate",):
        args.setdefault("--nodes", str(inputs["binary"]))
        args.setdefault("--pods", str(inputs["binary"]))
    argv = list(path)
    for key, value in args.items():
        argv += [value] if not key.startswith("--") else [key, value]
    # Positionals given by dest name ("kind", "file", "pod") go after the options.
    argv = [a for a in argv if a not in positional_values(args)] + positional_values(args)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))  # never reach a real cluster from here
    monkeypatch.chdir(tmp_path)
    if path in SERVERS:
        done = subprocess.run([sys.executable, "-m", "gpupack", *argv], env=dict(os.environ),
                              capture_output=True, text=True, timeout=60)
        code, err = done.returncode, done.stderr
    else:
        code, err = main(argv), capsys.readouterr().err
    assert "Traceback" not in err, err
    assert code == 2, (argv, code, err[-500:])
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and "error" in lines[-1], err


HOSTILE_KINDS = ["zero", "urandom", "fifo", "oversize", "deep"]
"""Files built to break a reader: endless, random, never-ending, too large, nested 100,000 deep."""
SAYS = {"zero": "a character device, not a regular file", "urandom": "a character device, not a regular file",
        "fifo": "a FIFO (named pipe), not a regular file", "oversize": "larger than the 1 MiB limit",
        "deep": "levels deep; at most 100 are read"}
"""What the one line says for each: the reason, not some later failure (the over-limit file is valid empty YAML)."""
TEST_LIMIT = 1024 * 1024
"""The size limit the hostile-file children run under (GPUPACK_MAX_INPUT_BYTES); the over-limit file is one byte more."""


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hostile-files")
    fifo = root / "fifo.yaml"
    os.mkfifo(fifo)  # nobody ever writes it: a blocking open waits forever
    oversize = root / "oversize.yaml"
    oversize.write_text("# " + "x" * TEST_LIMIT + "\n")  # a valid (empty) YAML document, one byte too many
    deep = root / "deep.yaml"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")  # valid YAML and JSON
    return {"zero": Path("/dev/zero"), "urandom": Path("/dev/urandom"), "fifo": fifo, "oversize": oversize,
            "deep": deep}


TRACE_COMMANDS = {("simulate",), ("replay",)}
"""Their CSV traces are read a row at a time: only the regular-file rule applies."""


def _bounded_memory() -> None:
    """The child's address space is capped, so a reader that slurps /dev/zero fails fast, not the machine."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (3 * 1024 ** 3, 3 * 1024 ** 3))


def command_line(path: tuple[str, ...], name: str, value: str, inputs: dict[str, Path]) -> list[str]:
    args = dict(valid_rest(path, inputs))
    if path == ("dra-plugin", "serve"):
        # A simulated node with its claims from a file, so that each option is what stops it; the
        # plugin reads its state file and credentials before it serves (a missing state file, which
        # the old test's "missing" kind gives, is created: hence this only here).
        work = inputs["directory"].parent / "dra"
        args.update({"--node": "n1", "--simulate": "H200:1", "--plugin-dir": str(work / "plugin"),
                     "--registration-dir": str(work / "registration"), "--cdi-dir": str(work / "cdi"),
                     "--claims-file": str(inputs["claims"]), "--health-interval-seconds": "0"})
    if name == "--kubeconfig":
        args.pop("--inventory", None)  # with an inventory file the webhook never reads credentials
        args.pop("--claims-file", None)  # nor the DRA plugin with a claims file
    args[name] = value
    if path == ("simulate",) or path == ("replay",):
        args.setdefault("--nodes", str(inputs["binary"]))
        args.setdefault("--pods", str(inputs["binary"]))
    argv = list(path)
    for key, item in args.items():
        argv += [item] if not key.startswith("--") else [key, item]
    return [a for a in argv if a not in positional_values(args)] + positional_values(args)


@pytest.mark.parametrize(("path", "name"), FILES, ids=[f"{' '.join(p)} {n}" for p, n in FILES])
@pytest.mark.parametrize("kind", HOSTILE_KINDS)
def test_hostile_files_get_one_line_and_exit_2(path: tuple[str, ...], name: str, kind: str, inputs: dict[str, Path],
                                               hostile: dict[str, Path], tmp_path: Path) -> None:
    """Each in a child with a timeout and capped memory: a reader that hangs on a FIFO or grows on
    /dev/zero fails this test instead of hanging it or the machine."""
    argv = command_line(path, name, str(hostile[kind]), inputs)
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    env.update(KUBECONFIG=str(tmp_path / "no-kubeconfig"), GPUPACK_MAX_INPUT_BYTES=str(TEST_LIMIT))
    try:
        done = subprocess.run([sys.executable, "-m", "gpupack", *argv], env=env, cwd=tmp_path, capture_output=True,
                              text=True, errors="replace", timeout=60, preexec_fn=_bounded_memory)
    except subprocess.TimeoutExpired:
        pytest.fail(f"gpupack {' '.join(argv)} did not answer within 60 s")
    lines = [line for line in done.stderr.splitlines() if line.strip() and "is deprecated; use" not in line]
    assert done.returncode == 2, (argv, done.returncode, done.stderr[-500:])
    assert len(lines) == 1 and lines[0].startswith("gpupack: error: "), done.stderr[-1000:]
    streamed = path in TRACE_COMMANDS and kind in ("oversize", "deep")  # traces are streamed: no size or depth rule
    pem = name in ("--tls-cert", "--tls-key") and kind == "deep"  # PEM, not YAML: no depth rule (OpenSSL refuses it)
    if not streamed and not pem:
        assert SAYS[kind] in lines[0], lines[0]


@pytest.mark.parametrize("kind", HOSTILE_KINDS)
def test_a_hostile_kubeconfig_variable_gets_one_line_and_exit_2(kind: str, hostile: dict[str, Path],
                                                                tmp_path: Path) -> None:
    """$KUBECONFIG names a file as surely as --kubeconfig does."""
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    env.update(KUBECONFIG=str(hostile[kind]), GPUPACK_MAX_INPUT_BYTES=str(TEST_LIMIT))
    try:
        done = subprocess.run([sys.executable, "-m", "gpupack", "agent", "health", "show", "--node", "n1"], env=env,
                              cwd=tmp_path, capture_output=True, text=True, errors="replace", timeout=60,
                              preexec_fn=_bounded_memory)
    except subprocess.TimeoutExpired:
        pytest.fail("gpupack agent health show did not answer within 60 s")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, (done.returncode, done.stderr[-500:])
    assert len(lines) == 1 and lines[0].startswith("gpupack: error: "), done.stderr[-1000:]
    assert SAYS[kind] in lines[0], lines[0]


def test_webhook_serve_on_a_taken_port(inputs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """uvicorn used to log an error and exit 3; the port is now checked first, with one line."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["webhook", "serve", "--tls-cert", str(inputs["cert"]), "--tls-key", str(inputs["key"]),
                     "--host", "127.0.0.1", "--port", str(port),
                     "--inventory", str(ROOT / "examples" / "inventory.yaml")])
    assert code == 2
    assert f"127.0.0.1:{port}, but another process is listening there" in capsys.readouterr().err
