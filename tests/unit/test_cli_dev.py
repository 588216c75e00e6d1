"""``gpupack dev cluster``: a corrupt state record is bad input for every subcommand."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupack.cli import main


@pytest.mark.parametrize("command", ["up", "down", "status"])
def test_a_corrupt_state_record_exits_2_and_is_kept(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    record = tmp_path / "state.json"
    record.write_text("{not json", encoding="utf-8")
    monkeypatch.setenv("GPUPACK_DEVCLUSTER_DIR", str(tmp_path))
    assert main(["dev", "cluster", command]) == 2
    err = capsys.readouterr().err
    assert "unreadable state file" in err and str(record) in err
    # Nothing was started, stopped or deleted on the strength of a record nobody can read.
    assert record.read_text(encoding="utf-8") == "{not json"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_command_group_that_fails_to_import_is_an_error_not_a_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command group that fails to import must not vanish silently from ``gpupack --help``."""
    import argparse

    import gpupack.cli as cli

    groups = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert {"mig", "simulate", "dev", "webhook", "agent", "controller", "demo"} <= set(groups.choices)
    monkeypatch.setattr(cli, "COMMAND_MODULES", (*cli.COMMAND_MODULES, "gpupack.cli_missing"))
    with pytest.raises(ModuleNotFoundError, match="gpupack.cli_missing"):
        cli.build_parser()


@pytest.mark.parametrize("flags, wanted", [
    pytest.param([], {"controller_manager": False}, id="default"),
    pytest.param(["--controller-manager"], {"controller_manager": True}, id="controller-manager"),
    pytest.param(["--kwok"], {"controller_manager": True, "kwok": True}, id="kwok-implies-controller-manager"),
])
def test_up_asks_for_optional_parts_only_with_their_flags(
    flags: list[str], wanted: dict[str, bool], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``up --controller-manager`` needs (and builds) kube-controller-manager, ``up --kwok`` kwok and
    kube-controller-manager; plain ``up`` neither."""
    import gpupack.devcluster.binaries as binaries
    from gpupack.devcluster.errors import BuildFailed

    asked: list[dict[str, bool]] = []

    def ensure(progress: object = None, build: bool = True, **parts: bool) -> None:
        asked.append(parts)
        raise BuildFailed("no binaries in this test", "none needed")

    monkeypatch.setenv("GPUPACK_DEVCLUSTER_DIR", str(tmp_path))
    monkeypatch.setattr(binaries, "ensure_binaries", ensure)
    assert main(["dev", "cluster", "up", *flags]) == 1
    assert asked == [wanted]
    assert "no binaries in this test" in capsys.readouterr().err


def test_up_help_describes_the_controller_manager_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # no wrapping inside words
    with pytest.raises(SystemExit):
        main(["dev", "cluster", "up", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--controller-manager also run kube-controller-manager" in out and "never node-lifecycle" in out


def test_up_kueue_says_how_to_build_kueue_when_it_is_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import gpupack.devcluster.binaries as binaries
    from gpupack.devcluster.errors import BuildFailed

    def no_kueue(progress: object = None, build: bool = True) -> Path:
        raise BuildFailed("Kueue is not built yet (kueue is missing)", "run tools/kueue/build.sh")

    monkeypatch.setenv("GPUPACK_DEVCLUSTER_DIR", str(tmp_path))
    monkeypatch.setattr(binaries, "ensure_binaries", lambda progress=None, build=True, **parts: object())
    monkeypatch.setattr(binaries, "ensure_kueue", no_kueue)
    assert main(["dev", "cluster", "up", "--kueue"]) == 1
    err = capsys.readouterr().err
    assert "Kueue is not built yet" in err and "tools/kueue/build.sh" in err


@pytest.mark.parametrize("replicas", ["0", "9"])
def test_up_refuses_a_kueue_replica_count_no_gpu_is_shared_into(
    replicas: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUPACK_DEVCLUSTER_DIR", str(tmp_path))
    assert main(["dev", "cluster", "up", "--kueue", "--kueue-replicas", replicas]) == 2
    assert f"--kueue-replicas {replicas}: a GPU is shared into 1..8 replicas" in capsys.readouterr().err
