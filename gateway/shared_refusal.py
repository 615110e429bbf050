"""What a refused publish of a shared document (the policy set, the tenant registry) means on this instance,
and the adoption of the stored one that follows (split out of gateway/shared_state.py in session 25, mend).

An operator's change made here is published to Redis inside its admin request (SF17-1). When another
instance stored that version or a higher one first, the publish is refused and :func:`refusal` says why:
``conflict`` (the stored document is adopted here at once, :func:`adopt_stored`, and the request answers
409), ``master_pending`` (a higher master generation is announced and not provisioned here, so the stored
record cannot be authenticated: the change stays in force on this instance only, 503, S22-review-3) or
``unresolved`` (Redis failed on the read that tells those two apart: 503 ``state_unavailable``,
S22-fixrot-2). Messages and logs name the document, versions and error classes, never policy text or
tenant data.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.shared_docs import SharedDocument

__all__ = ["adopt_stored", "admin_answer", "refusal", "superseded", "unshared_while_pending"]

log = logging.getLogger("prefixgate.state")
#: the admin error code of a refused publish's ``shared`` value, where they differ
_CODE = {"unresolved": "state_unavailable"}


def admin_answer(shared: str, message: str) -> tuple[int, str, str]:
    """The admin answer ``(status, code, message)`` of a change not shared: 409 ``conflict``, else 503 with
    ``master_pending`` or ``state_unavailable`` (for ``unresolved``)."""
    return {"conflict": 409}.get(shared, 503), _CODE.get(shared, shared), message


async def adopt_stored(doc: SharedDocument) -> bool:
    """Adopt the stored ``doc`` now (:meth:`gateway.shared_docs.SharedDocument.sync`), after a change made here
    lost to it (S17-1). Never raises: a failure (a Redis error, a stored document this instance refuses) is
    logged as a WARNING naming the document and the exception class only (S23-fixreg-3 for the registry,
    S24-fixreg-2 for the policy set; before, the policy set's failure went unsaid), and the next poll adopts it.

    Returns:
        True when adopted (or nothing newer was stored), False when it failed.
    """
    try:
        await doc.sync()
    except Exception as exc:  # noqa: BLE001 - any failure: the poll retries
        log.warning("shared state: adopting the stored %s failed (%s): the next poll does", doc.name,
                    type(exc).__name__)
        return False
    return True


async def refusal(doc: SharedDocument, version: int, what: str, master_pending: int, metrics: Any) -> tuple[str, str]:
    """After a refused publish of ``doc`` at ``version``: ``(shared, message)``, the message logged as an
    error (and a reload's answer). ``master_pending``: a master generation is pending here (``master_pending``,
    the announced generation, non-zero) and the stored record is not authenticated here
    (:func:`unshared_while_pending`, S22-review-3); ``unresolved``: Redis failed on that read, so neither is
    known (fail closed: answered 503 ``state_unavailable``; the next sync adopts the stored record if it can,
    S22-fixrot-2); else ``conflict`` (counted in ``metrics.rejected``; the caller adopts the stored record).
    ``what``: how the message names the change (``the change``, ``the reload``)."""
    try:
        unshared = await unshared_while_pending(doc, version, master_pending)
    except Exception as exc:  # noqa: BLE001 - Redis failed between the refused publish and this read
        message = (f"{doc.name} version {version} is applied on this instance and was not stored (another "
                   f"instance stored this version or a higher one first), and shared state failed "
                   f"({exc.__class__.__name__}) before the stored {doc.name} could be read: whether it "
                   f"replaces {what} here is decided when shared state answers again; check the {doc.name} "
                   f"in force, then retry")
        log.error("shared state: %s", message)
        return "unresolved", message
    if unshared is not None:
        return "master_pending", unshared
    metrics.rejected.labels(doc.name, "conflict").inc()
    message = (f"{doc.name} version {version} was stored by another instance first; its "
               f"{'registry' if doc.name == 'tenants' else 'set'} is adopted here: retry {what}")
    log.error("shared state: %s version %d was not stored (another instance published it or a higher one "
              "first); %s is answered 409 and the stored %s adopted", doc.name, version, what, doc.name)
    return "conflict", message


async def unshared_while_pending(doc: SharedDocument, version: int, master_pending: int) -> str | None:
    """After a refused publish: the message (logged as an error, and a reload's answer) when a master
    generation is pending here (``master_pending`` non-zero) and the stored record is not authenticated here,
    so this instance can neither replace nor adopt it (S20-FS1): the change is in force on this instance only
    until that generation is provisioned (S22-review-3); else None. Raises what the Redis read raises."""
    if not master_pending or not await doc.stored_unauthenticated():
        return None
    message = (f"{doc.name} version {version} is applied on this instance only and not shared: master "
               f"generation {master_pending} is announced and not provisioned here, so the stored {doc.name} "
               f"cannot be read; provision master generation {master_pending} on this instance (it then adopts "
               f"the stored {doc.name})")
    log.error("shared state: %s", message)
    return message


def superseded(doc: SharedDocument, version: int, metrics: Any) -> str:
    """The message (logged as an error; a reload's 409 ``conflict`` answer) of a change applied here that a
    ``doc`` ``version`` adopted from another instance replaced before the change was numbered and published
    (session 31, S31-review31-1: a tenants sync between a reload's apply and its publish; before, the adopted
    registry was published again under the next version and the reload answered 200, its change lost on every
    instance). Counted as a conflict in ``metrics.rejected``, as :func:`refusal`'s."""
    metrics.rejected.labels(doc.name, "conflict").inc()
    log.error("shared state: %s version %d adopted from another instance replaced the reload applied here "
              "before it was published; the reload is answered 409", doc.name, version)
    return (f"{doc.name} version {version} was stored by another instance first; its "
            f"{'registry' if doc.name == 'tenants' else 'set'} is adopted here: retry the reload")
