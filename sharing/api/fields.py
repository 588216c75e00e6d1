"""Reading fields of API objects (dicts) leniently: the wrong type reads as absent.

The readers of gpupack's API objects (``sharing.api.gpunode``, ``sharing.api.allocation``,
the controller's pod view and policy status) skip what does not read instead of
failing on it; these are the few field readers they share, so "absent" means
the same everywhere (a boolean is never an integer, a string never a list).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard


def as_map(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def as_list(value: Any) -> list[Any]:
    """``value`` if it is a list, else an empty one."""
    return value if isinstance(value, list) else []


def is_int(value: object) -> TypeGuard[int]:
    """An integer that is not a boolean."""
    return isinstance(value, int) and not isinstance(value, bool)


def as_int(value: Any, default: int = 0) -> int:
    """``value`` if it is an integer (not a boolean), else ``default``."""
    return value if is_int(value) else default
