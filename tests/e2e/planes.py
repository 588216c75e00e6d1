"""Control planes of a test module's own (the fixtures' shared body)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpupack.devcluster.binaries import Binaries
from gpupack.devcluster.controlplane import ControlPlane, ControlPlaneConfig
from gpupack.devcluster.errors import DevClusterError


def own_plane(binaries: Binaries, config: ControlPlaneConfig, with_what: str) -> Iterator[ControlPlane]:
    """A fixture's body for a control plane of its own: started (the test fails with the cause when it
    does not start: ``with_what`` names what it adds to a plain one), yielded, stopped."""
    try:
        own = ControlPlane(binaries, config).start()
    except DevClusterError as exc:
        pytest.fail(f"the control plane with {with_what} did not start:\n{exc}", pytrace=False)
    try:
        yield own
    finally:
        own.stop()
