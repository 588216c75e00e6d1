"""The gRPC layer (node.draplugin.service), the settings and the CLI's input checks: per-claim errors
with the call itself succeeding, registration's answer, and bad options refused with exit code 2."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from gpupack import cli_draplugin
from node.draplugin.claims import ClaimError, ClaimRef
from node.draplugin.prepare import PreparedDevice
from node.draplugin.service import DraService, RegistrationService
from node.draplugin.settings import PluginSettings
from node.kubeletapi import dra_v1_pb2 as dra
from node.kubeletapi import pluginregistration_v1_pb2 as reg


class StubPreparer:
    """Answers by claim name: ``ok`` prepares, ``bad`` is a ClaimError, ``bug`` an unexpected exception."""

    def __init__(self) -> None:
        self.unprepared: list[ClaimRef] = []

    def prepare(self, claim: ClaimRef) -> tuple[PreparedDevice, ...]:
        if claim.name == "bad":
            raise ClaimError("no such device")
        if claim.name == "bug":
            raise KeyError("oops")
        return (PreparedDevice("gpu", "node-a", "gpu-0", (f"gpu.gpupack.io/claim={claim.uid}-0",), None),
                PreparedDevice("s", "node-a", "gpu-1-shared", (f"gpu.gpupack.io/claim={claim.uid}-1",), "share-1"))

    def unprepare(self, claim: ClaimRef) -> None:
        if claim.name == "bad":
            raise ClaimError("in use")
        if claim.name == "bug":
            raise RuntimeError("oops")
        self.unprepared.append(claim)


def service() -> tuple[DraService, StubPreparer]:
    stub = StubPreparer()
    return DraService(stub), stub  # type: ignore[arg-type]


def claims(*names: str) -> list[dra.Claim]:
    return [dra.Claim(namespace="ml", name=name, uid=f"uid-{name}") for name in names]


def test_every_claim_gets_its_own_answer_and_errors_stay_with_their_claim() -> None:
    svc, _ = service()
    response = svc.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=claims("ok", "bad", "bug", "ok")), None)
    assert set(response.claims) == {"uid-ok", "uid-bad", "uid-bug"}
    ok = response.claims["uid-ok"]
    assert not ok.error and len(ok.devices) == 2  # listed twice, answered once
    assert list(ok.devices[0].request_names) == ["gpu"] and not ok.devices[0].HasField("share_id")
    assert ok.devices[1].share_id == "share-1" and list(ok.devices[1].cdi_device_ids) == ["gpu.gpupack.io/claim=uid-ok-1"]
    assert response.claims["uid-bad"].error == "no such device" and not response.claims["uid-bad"].devices
    assert response.claims["uid-bug"].error.startswith("internal error in gpupack's DRA plugin during prepare: KeyError")


def test_unprepare_answers_every_claim() -> None:
    svc, stub = service()
    response = svc.NodeUnprepareResources(dra.NodeUnprepareResourcesRequest(claims=claims("ok", "bad", "bug")), None)
    assert response.claims["uid-ok"].error == "" and stub.unprepared == [ClaimRef("uid-ok", "ml", "ok")]
    assert response.claims["uid-bad"].error == "in use"
    assert "RuntimeError: oops" in response.claims["uid-bug"].error


def test_registration_names_the_dra_socket_and_the_v1_service() -> None:
    registration = RegistrationService(Path("/var/lib/kubelet/plugins/gpu.gpupack.io/dra.sock"))
    info = registration.GetInfo(reg.InfoRequest(), None)
    assert (info.type, info.name, info.endpoint, list(info.supported_versions)) == (
        "DRAPlugin", "gpu.gpupack.io", "/var/lib/kubelet/plugins/gpu.gpupack.io/dra.sock", ["v1.DRAPlugin"])
    assert registration.status is None
    registration.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=False, error="bad version"), None)
    assert registration.status is not None and registration.status.error == "bad version"


def test_settings_default_to_the_kubelets_paths_and_read_the_environment() -> None:
    defaults = PluginSettings.from_env({})
    assert str(defaults.plugin_socket) == "/var/lib/kubelet/plugins/gpu.gpupack.io/dra.sock"
    assert str(defaults.registration_socket) == "/var/lib/kubelet/plugins_registry/gpu.gpupack.io-reg.sock"
    assert str(defaults.claims_dir) == "/var/lib/kubelet/plugins/gpu.gpupack.io/state/claims"
    assert defaults.cdi_dir == "/var/run/cdi" and defaults.share_mode == "mps"
    env = PluginSettings.from_env({"GPUPACK_DRA_NODE_NAME": "n1", "GPUPACK_DRA_STATE_DIR": "/data/dra",
                                   "GPUPACK_DRA_SHARE_MODE": "time-slicing"}, cdi_dir="/etc/cdi")
    assert (env.node_name, str(env.claims_dir), env.share_mode, env.cdi_dir) == (
        "n1", "/data/dra/claims", "time-slicing", "/etc/cdi")


@pytest.mark.parametrize(("values", "message"), [
    ({"share_mode": "mig"}, "share_mode 'mig' is not one of mps, time-slicing"),
    ({"plugin_dir": "/" + "x" * 120}, "longer than 107 bytes"),
    ({"cdi_dir": ""}, "cdi_dir must not be empty"),
    ({"mps_pipe_directory": "relative"}, "must be an absolute path"),
    ({"shutdown_grace_seconds": -1.0}, "must not be negative"),
])
def test_settings_out_of_range_are_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PluginSettings.from_env({}, **values)


@pytest.mark.parametrize(("argv", "message"), [
    (["serve", "--claims-file", "x"], "--node (or GPUPACK_DRA_NODE_NAME) is required"),
    (["serve", "--node", "n", "--simulate-delay-seconds", "1"], "are for the simulated backend"),
    (["serve", "--node", "n", "--simulate", "H100-80GB", "--claims-file", "x", "--state-dir", "{tmp}"],
     "--simulate wants MODEL:COUNT"),
    (["serve", "--node", "n", "--simulate", "T4:1", "--claims-file", "x", "--state-dir", "{tmp}"], "unknown GPU model"),
    (["serve", "--node", "n", "--plugin-dir", "/" + "y" * 120], "longer than 107 bytes"),
    (["call", "prepare", "--socket", "/nonexistent.sock", "ml/only-two"], "expected NAMESPACE/NAME/UID"),
])
def test_bad_options_exit_2_with_a_clear_message(argv: list[str], message: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in [v for v in os.environ if v.startswith("GPUPACK_DRA_")]:
        monkeypatch.delenv(variable)
    code = cli_draplugin.main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert code == 2
    assert message in capsys.readouterr().err


def test_a_call_to_no_plugin_says_so(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = cli_draplugin.main(["call", "unprepare", "--socket", str(tmp_path / "none.sock"), "--timeout", "2",
                               "ml/a/uid-a"])
    assert code == 1 and "did not answer: UNAVAILABLE" in capsys.readouterr().err


def test_every_environment_variable_the_help_names_is_a_setting(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_draplugin.main(["serve", "--help"])
    named = set(re.findall(r"GPUPACK_DRA_([A-Z_]+)", capsys.readouterr().out))
    fields = {name.upper() for name in PluginSettings.__dataclass_fields__}
    assert len(named) >= 12 and named <= fields, named - fields


def test_the_group_plugs_into_gpupacks_command_line(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from gpupack import cli

    if "gpupack.cli_draplugin" not in cli.COMMAND_MODULES:
        monkeypatch.setattr(cli, "COMMAND_MODULES", (*cli.COMMAND_MODULES, "gpupack.cli_draplugin"))
    assert cli.main(["dra-plugin", "call", "prepare", "ml/no-uid"]) == 2
    assert "expected NAMESPACE/NAME/UID" in capsys.readouterr().err
