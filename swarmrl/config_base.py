"""What every configuration section shares: strict pydantic models, and the error
that names the key (swarmrl/config.py loads and documents them)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A configuration problem, with a message that names the key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
