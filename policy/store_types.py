"""The types of :mod:`policy.store`: change records, its errors, and the targets it applies changes to.

Imported through :mod:`policy.store` (which re-exports every name here).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol

from opa_client import AsyncOpaClient

from policy.decision import PolicyError
from policy.loader import PolicySet, is_test_module
from policy.rego_test_runner import TestReport

__all__ = ["ChangeRecord", "PolicyConflictError", "PolicyNotFoundError", "PolicyRejectedError", "PolicyTarget",
           "PolicyTargetError", "RemoteOpaTarget"]


@dataclass(frozen=True)
class ChangeRecord:
    """One accepted change: ``who`` (operator id), ``kind`` policy|data,
    ``op`` put|delete, ``target`` (policy id or data path), SHA-256 hex
    digests of the old and new content (None when absent), ``version``
    (monotonic), ``time`` (seconds since the epoch). ``shared`` (shared state, issue 16; in the
    audit record and the admin answer, not in ``record.json``): what publishing it inside the change
    gave, ``published``, ``conflict`` (another instance stored this version first; this change is
    replaced by that one and the admin request answers 409, SF17-1) or ``unpublished`` (Redis did not
    answer; the next sync publishes it); None without shared state and for an adopted set."""

    version: int
    who: str
    kind: Literal["policy", "data"]
    op: Literal["put", "delete"]
    target: str
    old_sha256: str | None
    new_sha256: str | None
    time: float
    shared: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible form (for audit and the admin API)."""
        return asdict(self)


class PolicyRejectedError(PolicyError):
    """A change was refused: it does not compile or a Rego test fails.

    ``report`` is the test report (compile ``errors`` or failing tests).
    """

    def __init__(self, message: str, report: TestReport) -> None:
        super().__init__(message)
        self.report = report


class PolicyTargetError(PolicyError):
    """The decision point refused or failed to apply a validated change."""


class PolicyConflictError(PolicyError):
    """Another gateway instance stored the same policy version first (SF17-1): this instance's change
    is replaced by the stored one (adopted as the next version); the operator retries. ``record``: the
    change (``shared="conflict"``), also handed to audit."""

    def __init__(self, message: str, record: ChangeRecord) -> None:
        super().__init__(message)
        self.record = record


class PolicyNotFoundError(PolicyError, KeyError):
    """No policy module or data document with that id/path."""


class PolicyTarget(Protocol):
    """Where accepted changes are applied (EmbeddedOpa implements it)."""

    async def apply(self, change: ChangeRecord, policy_set: PolicySet) -> None:
        """Apply one change; ``policy_set`` is the complete new set."""
        ...


class RemoteOpaTarget:
    """Applies changes to a remote OPA through opa-python-client.

    Args:
        client: a started AsyncOpaClient (e.g. ``RemoteOpa.client``).
        on_applied: called after each change (e.g. ``RemoteOpa.notify_change``
            so the decision cache clears).

    Test modules are not pushed. Uploads use ``rego_compat=False`` so the
    client never rewrites policy text.
    """

    def __init__(self, client: AsyncOpaClient, on_applied: Callable[[], None] | None = None) -> None:
        self._client = client
        self._on_applied = on_applied

    async def apply(self, change: ChangeRecord, policy_set: PolicySet) -> None:
        """Push one change (raises PolicyTargetError when OPA refuses)."""
        try:
            if change.kind == "policy":
                if is_test_module(change.target):
                    return
                if change.op == "put":
                    await self._client.update_policy_from_string(
                        policy_set.modules[change.target], change.target, rego_compat=False
                    )
                else:
                    await self._client.delete_policy(change.target)
            else:
                if change.op == "put":
                    await self._client.update_or_create_data(policy_set.data_docs[change.target], change.target)
                else:
                    await self._client.delete_data(change.target)
        except Exception as exc:  # the client raises many unrelated types
            raise PolicyTargetError(f"remote OPA refused the change: {type(exc).__name__}") from None
        if self._on_applied is not None:
            self._on_applied()
