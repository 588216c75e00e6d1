"""Settings from the environment: one reading for the webhook, the controller and the agent (kube.settings)."""

from __future__ import annotations

import pytest

from controller.settings import ControllerSettings
from kube.settings import env_value
from node.base.settings import AgentSettings
from webhook.settings import WebhookSettings


@pytest.mark.parametrize(("raw", "value"), [("1", True), ("TRUE", True), ("yes", True), ("On", True), (" true ", True),
                                           ("0", False), ("false", False), ("No", False), ("off", False)])
def test_every_component_reads_a_boolean_alike(raw: str, value: bool) -> None:
    assert WebhookSettings.from_env({"GPUPACK_WEBHOOK_ACCESS_LOG": raw}).access_log is value
    assert ControllerSettings.from_env({"GPUPACK_CONTROLLER_EVICT_ON_GPU_FAULT": raw}).evict_on_gpu_fault is value
    assert AgentSettings.from_env({"GPUPACK_AGENT_PAUSE_DEVICE_PLUGIN": raw}).pause_device_plugin is value


@pytest.mark.parametrize(
    ("variable", "raw", "default", "says"),
    [
        ("X_FLAG", "maybe", True, "X_FLAG='maybe': expected true or false"),
        ("X_PORT", "eighty", 80, "X_PORT='eighty': expected an integer"),
        ("X_PORT", "8.5", 80, "expected an integer"),
        ("X_SECONDS", "soon", 1.5, "X_SECONDS='soon': expected a number"),
    ],
)
def test_a_value_that_does_not_read_names_its_variable(variable: str, raw: str, default: object, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        env_value(variable, raw, default)


def test_values_read_by_the_type_of_their_default() -> None:
    assert env_value("X", "7", 1) == 7 and env_value("X", "7", 1.0) == 7.0 and env_value("X", " a ", "") == " a "
    settings = ControllerSettings.from_env({"GPUPACK_CONTROLLER_RESYNC_SECONDS": "2.5"}, policy=None)
    assert settings.resync_seconds == 2.5 and settings.policy == ControllerSettings().policy  # None: no override
    with pytest.raises(ValueError, match="GPUPACK_CONTROLLER_WRITE_WORKERS"):
        ControllerSettings.from_env({"GPUPACK_CONTROLLER_WRITE_WORKERS": "many"})


@pytest.mark.parametrize("raw", ["nan", "NaN", "inf", "-inf"])
def test_numbers_that_are_not_finite_are_refused_from_every_source(raw: str) -> None:
    """NaN passes every range check (all comparisons are false), so it used to be accepted and then
    never ended a wait: for example GPUPACK_AGENT_POLL_SECONDS=nan."""
    with pytest.raises(ValueError, match="poll_seconds must be a finite number"):
        AgentSettings.from_env({"GPUPACK_AGENT_POLL_SECONDS": raw})
    with pytest.raises(ValueError, match="lease_seconds must be a finite number"):
        ControllerSettings.from_env({}, lease_seconds=float(raw))
    with pytest.raises(ValueError, match="resync_seconds must be a finite number"):
        WebhookSettings.from_env({"GPUPACK_WEBHOOK_RESYNC_SECONDS": raw})
