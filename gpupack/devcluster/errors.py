"""Errors of the local control plane, each naming its cause and the fix."""

from __future__ import annotations


class DevClusterError(Exception):
    """A control-plane problem a person can act on: what went wrong and how to fix it."""

    def __init__(self, cause: str, fix: str, detail: str = "") -> None:
        self.cause = cause
        self.fix = fix
        self.detail = detail
        text = f"{cause}\n  fix: {fix}"
        if detail:
            text += "\n" + detail
        super().__init__(text)


class ToolchainMissing(DevClusterError):
    """Go is not installed, so the binaries cannot be built."""


class BuildFailed(DevClusterError):
    """tools/k8s/build.sh ran and failed."""


class StartFailed(DevClusterError):
    """A component exited or never became ready."""


class PortInUse(StartFailed):
    """A port the control plane needs is taken by another process."""
