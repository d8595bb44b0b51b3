"""A configuration as dotted overrides: the inverse of `parse_override` (run.py).

A `RunConfig` built in code reaches the processes of a swarm the way every other
setting does, as `key.path=value` arguments on their command lines, so that a
process started by the launcher and one started by hand read their settings the
same way. Only the settings that differ from the defaults are written, each value
as a TOML literal that `parse_override` reads back to the same value. TOML has no
null: a setting set to None where its default is something else cannot be
written, and says so.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel

from swarmrl.errors import ConfigError


def toml_value(value: Any, key: str = "value") -> str:
    """`value` (a JSON-like value, as `model_dump(mode="json")` gives) as a TOML literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v, key) for v in value) + "]"
    if isinstance(value, dict):
        items = (f"{json.dumps(str(k))} = {toml_value(v, key)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    if value is None:
        raise ConfigError(f"{key}: None cannot be passed as a setting (TOML has no null)")
    raise ConfigError(f"{key}: a {type(value).__name__} cannot be passed as a setting")


def config_overrides(cfg: BaseModel) -> list[str]:
    """The dotted overrides that turn the defaults of `type(cfg)` into `cfg`."""
    out: list[str] = []

    def walk(model: BaseModel, default: BaseModel, prefix: str) -> None:
        for name in type(model).model_fields:
            value, base = getattr(model, name), getattr(default, name)
            key = prefix + name
            if isinstance(value, BaseModel) and type(value) is type(base):
                walk(value, base, key + ".")
                continue
            mine = model.model_dump(mode="json", include={name})[name]
            if mine != default.model_dump(mode="json", include={name})[name]:
                out.append(f"{key}={toml_value(mine, key)}")

    walk(cfg, type(cfg)(), "")
    return out
