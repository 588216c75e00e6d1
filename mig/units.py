"""Kubernetes resource quantities for memory (``20Gi``, ``10G``, ``512Mi``, ``1e9``).

Implemented from the Kubernetes quantity grammar (a decimal number, an optional
exponent, and a binary ``Ki..Ei`` or decimal ``k..E`` or ``m`` suffix). Memory is
rounded *up* to whole bytes, as Kubernetes does for byte quantities.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation

from mig.errors import RequestError

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"m": Decimal("0.001"), "": Decimal(1), "k": Decimal(10**3), "M": Decimal(10**6),
            "G": Decimal(10**9), "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18)}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E))?$")
_EXAMPLES = "examples: 20Gi, 512Mi, 10G, 1e9"


def parse_quantity(text: str | int | float) -> Decimal:
    """A Kubernetes quantity as an exact decimal; raises ``RequestError`` with the reason."""
    if isinstance(text, bool):
        raise RequestError(f"invalid quantity {text!r}; {_EXAMPLES}")
    if isinstance(text, int):
        return Decimal(text)
    if isinstance(text, float):
        return Decimal(repr(text))
    match = _QUANTITY.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise RequestError(f"invalid quantity {text!r}; {_EXAMPLES}")
    number, exponent, suffix = match.groups()
    try:
        value = Decimal(number)
        if exponent:
            value = value.scaleb(int(exponent[1:]))
    except (InvalidOperation, ValueError):
        raise RequestError(f"invalid quantity {text!r}; {_EXAMPLES}") from None
    if suffix in _BINARY:
        return value * _BINARY[suffix]
    return value * _DECIMAL[suffix or ""]


def parse_memory(text: str | int | float) -> int:
    """Memory quantity in bytes (rounded up); negative or absurd values are refused."""
    value = parse_quantity(text)
    if value < 0:
        raise RequestError(f"memory quantity {text!r} is negative")
    if value > Decimal(2**60):
        raise RequestError(f"memory quantity {text!r} is larger than any GPU")
    return int(value.to_integral_value(rounding=ROUND_CEILING))


def format_mib(mib: int) -> str:
    """``81920`` -> ``80Gi``; ``20090`` -> ``19.62Gi`` (two decimals, as nvidia-smi prints GiB)."""
    if mib % 1024 == 0:
        return f"{mib // 1024}Gi"
    return f"{mib / 1024:.2f}Gi"
