"""Component settings from the environment, read one way by the webhook, the controller and the agent.

Each component keeps its settings as one frozen dataclass with documented
defaults and a ``validate()`` method; every field can also be set from
``<PREFIX><FIELD>`` (upper case: ``GPUPACK_AGENT_IDLE_SECONDS``), and
command-line flags win over the environment. A value is read by the type of
the field's default: booleans accept ``1/0``, ``true/false``, ``yes/no`` and
``on/off`` (any case), integers and floats their usual text, anything else is
taken as it is. A value that does not read names its variable and says what
was expected.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any, Protocol, TypeVar

TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off"})


class Settings(Protocol):
    def validate(self) -> None:
        """Raise ValueError naming the first setting out of range."""
        ...


S = TypeVar("S", bound=Settings)


def settings_from_env(
    cls: type[S], prefix: str, env: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None
) -> S:
    """Defaults, then ``<prefix><FIELD>`` variables from ``env`` (the process environment when
    None), then the ``overrides`` that are not None; validated."""
    source = os.environ if env is None else env
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]  # S is a dataclass by contract
        raw = source.get(prefix + f.name.upper())
        if raw is not None:
            values[f.name] = env_value(prefix + f.name.upper(), raw, _default(f))
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        value = values.get(f.name)
        if isinstance(value, float) and not math.isfinite(value):
            # NaN passes every range check (all comparisons are false) and then never ends a wait.
            raise ValueError(f"{f.name} must be a finite number, got {value}")
    settings = cls(**values)
    settings.validate()
    return settings


def env_value(variable: str, raw: str, default: Any) -> Any:
    """``raw`` read as the type of ``default``; ValueError naming ``variable`` if it does not read."""
    text = raw.strip()
    if isinstance(default, bool):
        if text.lower() in TRUE:
            return True
        if text.lower() in FALSE:
            return False
        raise ValueError(f"{variable}={raw!r}: expected true or false")
    try:
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
    except ValueError:
        kind = "an integer" if isinstance(default, int) else "a number"
        raise ValueError(f"{variable}={raw!r}: expected {kind}") from None
    return raw


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None
