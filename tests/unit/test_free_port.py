"""Ports picked for servers the tests and the dev cluster start."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from gpupack.devcluster.process import LOWEST_PICKED_PORT, LINUX_EPHEMERAL_RANGE, ephemeral_range, free_port


def test_ports_are_picked_below_the_ephemeral_range_and_bindable() -> None:
    low, _ = ephemeral_range()
    ports = [free_port() for _ in range(20)]
    if low - LOWEST_PICKED_PORT >= 1000:
        assert all(LOWEST_PICKED_PORT <= port < low for port in ports)
    for port in ports:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))


def test_a_port_is_not_handed_out_twice_in_one_process() -> None:
    # The same seed would repeat picks; what was handed out is skipped.
    first = [free_port(rng=random.Random(7)) for _ in range(5)]
    assert len(set(first)) == 5


def test_a_listening_port_is_not_picked() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port(rng=random.Random(11))))
        sock.listen()
        taken = sock.getsockname()[1]
        # Ports handed out are skipped anyway; forget this one so only the bind check stands between.
        from gpupack.devcluster import process

        process._handed_out.discard(taken)
        assert free_port(rng=random.Random(11)) != taken


def test_no_room_below_the_range_falls_back_to_the_kernels_pick() -> None:
    port = free_port(ephemeral=(1024, 65535))
    assert port >= 1024


def test_the_range_is_read_from_the_kernel_file(tmp_path: Path) -> None:
    path = tmp_path / "range"
    path.write_text("40000\t50000\n")
    assert ephemeral_range(path) == (40000, 50000)
    path.write_text("garbage\n")
    assert ephemeral_range(path) == LINUX_EPHEMERAL_RANGE
    assert ephemeral_range(tmp_path / "missing") == LINUX_EPHEMERAL_RANGE
