"""NVML errors as gpupack sees them: one exception carrying NVML's numeric return code.

The codes are NVML's own ``NVML_ERROR_*`` values, taken from nvidia-ml-py (a pure
Python module: importing it does not load libnvidia-ml), so a simulated failure and
a real one look the same to the reconciler and in logs.
"""

from __future__ import annotations

import pynvml  # type: ignore[import-untyped]

SUCCESS: int = pynvml.NVML_SUCCESS
UNINITIALIZED: int = pynvml.NVML_ERROR_UNINITIALIZED
INVALID_ARGUMENT: int = pynvml.NVML_ERROR_INVALID_ARGUMENT
NOT_SUPPORTED: int = pynvml.NVML_ERROR_NOT_SUPPORTED
NO_PERMISSION: int = pynvml.NVML_ERROR_NO_PERMISSION
NOT_FOUND: int = pynvml.NVML_ERROR_NOT_FOUND
INSUFFICIENT_RESOURCES: int = pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
GPU_IS_LOST: int = pynvml.NVML_ERROR_GPU_IS_LOST
RESET_REQUIRED: int = pynvml.NVML_ERROR_RESET_REQUIRED
IN_USE: int = pynvml.NVML_ERROR_IN_USE
LIBRARY_NOT_FOUND: int = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
DRIVER_NOT_LOADED: int = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
TIMEOUT: int = pynvml.NVML_ERROR_TIMEOUT
UNKNOWN: int = pynvml.NVML_ERROR_UNKNOWN

_NAMES: dict[int, str] = {
    SUCCESS: "SUCCESS",
    UNINITIALIZED: "UNINITIALIZED",
    INVALID_ARGUMENT: "INVALID_ARGUMENT",
    NOT_SUPPORTED: "NOT_SUPPORTED",
    NO_PERMISSION: "NO_PERMISSION",
    NOT_FOUND: "NOT_FOUND",
    INSUFFICIENT_RESOURCES: "INSUFFICIENT_RESOURCES",
    GPU_IS_LOST: "GPU_IS_LOST",
    RESET_REQUIRED: "RESET_REQUIRED",
    IN_USE: "IN_USE",
    LIBRARY_NOT_FOUND: "LIBRARY_NOT_FOUND",
    DRIVER_NOT_LOADED: "DRIVER_NOT_LOADED",
    TIMEOUT: "TIMEOUT",
    UNKNOWN: "UNKNOWN",
}

CODES_BY_NAME: dict[str, int] = {name: code for code, name in _NAMES.items()}

# Errors after which retrying the same call cannot help until something external
# changes (a reset, a driver, a permission): the reconciler rolls back on these and
# reports instead of hammering the driver.
PERMANENT: frozenset[int] = frozenset(
    {NOT_SUPPORTED, NO_PERMISSION, RESET_REQUIRED, GPU_IS_LOST, LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED}
)


def code_name(code: int) -> str:
    """``NVML_ERROR_<NAME>`` for a known code, ``NVML_ERROR_<code>`` otherwise."""
    return "NVML_ERROR_" + _NAMES.get(code, str(code))


class NvmlError(Exception):
    """An NVML call failed with return code ``code`` (an ``NVML_ERROR_*`` value)."""

    def __init__(self, code: int, detail: str = "") -> None:
        self.code = code
        self.detail = detail
        text = code_name(code)
        super().__init__(f"{text}: {detail}" if detail else text)

    @property
    def name(self) -> str:
        return code_name(self.code)

    @property
    def permanent(self) -> bool:
        return self.code in PERMANENT
