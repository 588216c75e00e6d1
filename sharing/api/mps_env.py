"""An MPS client's limits as its environment carries them: the variables, written and read here once.

An MPS client process takes its own limits from its environment when CUDA starts in it (NVIDIA's
MPS documentation, "Appendix: Environment Variables"):

* ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: the share of the GPU's SMs the client may use, a number.
* ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``: the device memory the client may allocate, per device:
  comma-separated ``<device>=<limit>`` entries, the device named as ``CUDA_VISIBLE_DEVICES`` names
  it (an ordinal as CUDA numbers it inside the container, or a UUID), the limit a whole number
  with ``M``/``MB`` (MiB) or ``G``/``GB`` (GiB), e.g. ``0=1G,1=512MB``. A client's value only
  narrows the MPS control daemon's default (``set_default_device_pinned_mem_limit``); the
  daemon's is obeyed where it is lower (same page).

gpupack writes the memory limit in one form, ``<ordinal>=<MiB>M`` (:func:`pinned_memory_value`):
the webhook for a device-plugin MPS share (``sharing.admission.decision``), the DRA kubelet plugin
for a DRA share (``node.draplugin.mps``). :func:`parse_pinned_memory` reads any documented form
back (the simulated NVML reads a client's limit with it, as the real driver does at the client's
start) and refuses anything else with an error naming the value: a limit silently dropped would let
the client use the whole GPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

THREAD_PERCENTAGE_ENV: Final = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
PINNED_MEMORY_ENV: Final = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
PIPE_DIRECTORY_ENV: Final = "CUDA_MPS_PIPE_DIRECTORY"

_UNIT_MIB: Final = {"M": 1, "MB": 1, "G": 1024, "GB": 1024}
_ENTRY = re.compile(r"(?P<device>\d+|(?:GPU|MIG)-[0-9A-Za-z/-]+)=(?P<amount>\d+)(?P<unit>[A-Za-z]*)")


class MpsEnvError(ValueError):
    """An MPS variable whose value is not in its documented form; the message names the value."""


def pinned_memory_value(mib: int, ordinal: int = 0) -> str:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``'s value for a client that may allocate ``mib`` MiB of
    device ``ordinal`` (the callers round bytes to MiB, each in the direction its contract needs)."""
    if mib < 1:
        raise MpsEnvError(f"an MPS pinned memory limit must be at least 1 MiB, got {mib} MiB")
    if ordinal < 0:
        raise MpsEnvError(f"a CUDA device ordinal is not negative, got {ordinal}")
    return f"{ordinal}={mib}M"


def parse_pinned_memory(value: str) -> dict[str, int]:
    """Device (ordinal as text, or UUID) -> MiB of a ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` value.

    Raises :class:`MpsEnvError` naming the value for an empty value or entry, an entry that is not
    ``<device>=<number><unit>``, a unit other than M, MB, G or GB, a limit of 0, or a device named
    twice."""
    limits: dict[str, int] = {}
    if not value.strip():
        raise MpsEnvError(f"{PINNED_MEMORY_ENV}={value!r}: empty; expected <device>=<limit>[,...], e.g. 0=16384M")
    for entry in value.split(","):
        match = _ENTRY.fullmatch(entry.strip())
        if match is None:
            raise MpsEnvError(f"{PINNED_MEMORY_ENV}={value!r}: entry {entry!r} is not <device>=<limit> "
                              "(a device ordinal or UUID, a whole number and M, MB, G or GB, e.g. 0=16384M)")
        device, unit = match["device"], match["unit"]
        if unit not in _UNIT_MIB:
            raise MpsEnvError(f"{PINNED_MEMORY_ENV}={value!r}: unit {unit!r} of entry {entry!r} is not one of "
                              f"{', '.join(_UNIT_MIB)}")
        mib = int(match["amount"]) * _UNIT_MIB[unit]
        if mib < 1:
            raise MpsEnvError(f"{PINNED_MEMORY_ENV}={value!r}: entry {entry!r} allows no memory at all")
        if device.isdigit():
            device = str(int(device))  # "00" and "0" name one device
        if device in limits:
            raise MpsEnvError(f"{PINNED_MEMORY_ENV}={value!r}: device {device} is named twice")
        limits[device] = mib
    return limits


def pinned_memory_mib(env: Mapping[str, str], ordinal: int = 0, uuid: str | None = None) -> int | None:
    """The pinned memory limit, MiB, that the environment ``env`` gives its client on the device it
    numbers ``ordinal`` (or names by ``uuid``); None where it sets none for that device.
    :class:`MpsEnvError` for a malformed value (:func:`parse_pinned_memory`)."""
    value = env.get(PINNED_MEMORY_ENV)
    if value is None:
        return None
    limits = parse_pinned_memory(value)
    found = [mib for device, mib in limits.items() if device == str(ordinal) or (uuid is not None and device == uuid)]
    return min(found, default=None)
