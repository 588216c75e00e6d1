"""Errors of the MIG domain. Each names the problem and the valid choices."""

from __future__ import annotations

from collections.abc import Sequence


class MigError(ValueError):
    """Base class: bad input to the MIG domain (a user or config error, not a bug)."""


class UnknownModelError(MigError):
    def __init__(self, name: str, valid: list[str]) -> None:
        self.name = name
        self.valid = valid
        super().__init__(f"unknown GPU model {name!r}; valid models: {', '.join(valid)}")


class UnknownProfileError(MigError):
    def __init__(self, name: str, product: str, valid: Sequence[str]) -> None:
        self.name = name
        self.model = product
        super().__init__(f"unknown MIG profile {name!r} for {product}; valid profiles: {', '.join(valid)}")


class RequestError(MigError):
    """A compute/memory request that is out of range or that no profile covers."""
