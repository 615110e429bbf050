"""What every configuration section shares: :class:`ConfigError` and the strict :class:`ConfigSection` base."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """Raised when the configuration file is missing, unparsable or invalid."""


class ConfigSection(BaseModel):
    """Base of every configuration section: unknown keys are refused (``extra="forbid"``)."""

    model_config = ConfigDict(extra="forbid")
