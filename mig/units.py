"""Kubernetes resource quantities for memory (``20Gi``, ``10G``, ``512Mi``, ``1e9``).

Implemented from the Kubernetes quantity grammar (a decimal number and either an
exponent or a binary ``Ki..Ei`` / decimal ``n, u, m, k..E`` suffix). The one
quantity parser of gpupack: the webhook's request model wraps it. Memory is
rounded *up* to whole bytes, as Kubernetes does for byte quantities.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation

from mig.errors import RequestError

# number, then either a decimal exponent (``e3``, ``E-2``) or a suffix; ``E`` alone is exa, not
# an exponent, so the two are separate groups (the Kubernetes grammar reads them the same way).
_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:[eE]([+-]?[0-9]+)|([KMGTPE]i|[numkMGTPE])?)$"
)
_SUFFIX: dict[str, Decimal] = {
    "": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12, "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40, "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}
_EXAMPLES = "a Kubernetes quantity such as 20Gi, 512Mi, 10G, 250m or 1e9"
_MAX_TEXT = 64  # longer strings are not quantities; refusing them early bounds the work
_MAX_EXPONENT = 30


def parse_quantity(value: object) -> Decimal:
    """A Kubernetes quantity as an exact decimal; raises ``RequestError`` naming the value.

    Accepts strings (``250m``, ``1e3``, ``20Gi``), ints and finite floats (YAML
    and JSON give those for unquoted numbers); refuses booleans, NaN, infinities,
    absurd exponents and anything else.
    """
    if isinstance(value, bool):  # bool is an int subclass, never a quantity
        raise RequestError(f"{value!r} is not a quantity; expected {_EXAMPLES}")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise RequestError(f"{value!r} is not a finite quantity")
        return Decimal(repr(value))
    if not isinstance(value, str) or len(value) > _MAX_TEXT:
        raise RequestError(f"{str(value)[:_MAX_TEXT]!r} is not {_EXAMPLES}")
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise RequestError(f"{value!r} is not {_EXAMPLES}")
    number, exponent_text, suffix = match.groups()
    try:
        base = Decimal(number)
        if exponent_text is not None:
            exponent = int(exponent_text)
            if abs(exponent) > _MAX_EXPONENT:
                raise RequestError(f"{value!r} is out of range")
            return base.scaleb(exponent)
        return base * _SUFFIX[suffix or ""]
    except InvalidOperation:
        raise RequestError(f"{value!r} is not a valid quantity") from None


def parse_memory(text: object) -> int:
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
