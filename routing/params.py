"""Base of every policy's parameter model (pydantic; validated, typed)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["PolicyParams", "describe_errors"]


class PolicyParams(BaseModel):
    """Parameters of one policy: unknown keys, NaN and infinities are errors;
    ``name`` is the discriminator of :data:`routing.config.PolicyConfig`."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def describe_errors(exc: ValidationError) -> str:
    """``key: message`` for every problem of ``exc``, ``; ``-separated."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '(parameters)'}: {err['msg']}" for err in exc.errors()
    )
