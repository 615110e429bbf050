"""The answers of admission's refusals and the output-token clamp (pure functions of :mod:`gateway.admission`,
which re-exports them; split out in session 16 to keep that module under the size bound)."""

from __future__ import annotations

from gateway.errors import GatewayError
from tenancy.limits import RateLimited
from tenancy.shared import StateUnavailable

__all__ = ["check_prompt_bytes", "clamp_output", "state_unavailable", "token_limited", "too_many"]


def state_unavailable(exc: StateUnavailable) -> GatewayError:
    """503 ``state_unavailable`` with ``Retry-After``: the shared limits do not answer and
    ``state.on_unavailable`` is ``fail_closed`` (docs/scale-out.md)."""
    return GatewayError(503, "state_unavailable", "shared tenant limits are unavailable; retry later",
                        headers={"Retry-After": exc.retry_after_header})


def too_many(retry_after_s: float, code: str, message: str) -> GatewayError:
    """A 429 with ``Retry-After`` (whole seconds, at least 1)."""
    return GatewayError(429, code, message, headers={"Retry-After": str(max(1, int(retry_after_s + 0.999)))},
                        outcome="rate_limited")


def token_limited(exc: RateLimited) -> GatewayError:
    """429 ``token_rate_limited`` for a ledger refusal (prompt- or output-token bucket)."""
    what = "output" if exc.reason == "tenant_output_tokens" else "prompt"
    return too_many(exc.retry_after_s, "token_rate_limited", f"tenant {what}-token rate exceeded")


def clamp_output(requested: int | None, tenant_cap: int | None, policy_cap: int | None, gateway_cap: int) -> int:
    """Output-token cap: request → min(tenant cap, policy cap, gateway cap); absent → that cap (at least 1).

    = ``max(1, min(clamp_max_tokens(requested, tenant_cap, policy_cap, default=gateway_cap), gateway_cap))``
    without its lists (session 9; hypothesis: tests/gateway/test_s9_clamp_output.py): the smallest of the
    values given. Raises :class:`ValueError` for a non-positive or boolean ``requested``, as it does."""
    if requested is not None and (isinstance(requested, bool) or requested <= 0):
        raise ValueError("max_tokens must be a positive integer")
    cap = gateway_cap
    if requested is not None and requested < cap:
        cap = requested
    if tenant_cap is not None and tenant_cap < cap:
        cap = tenant_cap
    if policy_cap is not None and policy_cap < cap:
        cap = policy_cap
    return cap if cap >= 1 else 1


def check_prompt_bytes(prompt_bytes: list[int] | tuple[int, ...], max_bytes: int) -> None:
    """The tenant's ``max_prompt_bytes`` bound (UTF-8 bytes per sequence): raises 400 ``prompt_too_large``
    for the first sequence above ``max_bytes``. Checked at arrival (``Admission.prompt_tokens``) and
    again at a re-decision (gateway/pep_recheck.py, S19-R6)."""
    for size in prompt_bytes:
        if size > max_bytes:
            raise GatewayError(400, "prompt_too_large", f"prompt has {size} bytes; this tenant's limit is {max_bytes}",
                               param=None, client_text=True)
