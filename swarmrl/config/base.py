"""What every configuration section shares: a strict pydantic model.

An unknown key is an error that names it (`extra="forbid"`), and assignments
are validated too. The run's loader is in config/run.py.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from swarmrl.errors import ConfigError

__all__ = ["DEVICE_SETTING", "ConfigError", "Section"]

# A process's device setting (swarmrl/device.py resolves it): auto, cpu, cuda or cuda:N.
DEVICE_SETTING = r"^(auto|cpu|cuda(:[0-9]{1,2})?)$"


class Section(BaseModel):
    """A configuration section: every field has a description and its bounds."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
