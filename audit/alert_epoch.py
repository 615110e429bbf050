"""The epoch time of a concentration alert's observation (session 25, S25-newcomer-5).

A ``kind="alert"`` event's ``alert.observed_at_s`` is the monitor's clock, ``time.monotonic`` (seconds since an
arbitrary point, on Linux the boot: 68793.789 is not a time of day), at the last observation the alert was
judged on. It stays as it is (SIEM rules and the tests read it; renaming it would change the audit schema).
:func:`with_observed_epoch` adds ``alert.observed_at_epoch_s``: the same instant in Unix seconds, computed as
the event's own wall time (``time_ms``, set when the event is built) minus the observation's age on the
monotonic clock. An additive key of the open ``alert`` map (``AuditEvent.from_dict`` does not check its keys):
no schema change. The gateway wraps the monitor's ``on_alert`` with :func:`stamping_observed_epoch`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from audit.event import AuditEvent

__all__ = ["stamping_observed_epoch", "with_observed_epoch"]


def with_observed_epoch(event: AuditEvent, monotonic_now_s: float) -> AuditEvent:
    """``event`` with ``alert.observed_at_epoch_s`` (Unix seconds, 3 decimals = ms) added.

    Args:
        event: an alert event whose ``alert.observed_at_s`` is a reading of the monotonic clock (s).
        monotonic_now_s: the same clock read now, next to the event's ``time_ms`` (UTC epoch ms).

    Returns:
        a new event (``event`` is frozen); ``event`` itself when it has no numeric ``alert.observed_at_s``
        (another kind, or an alert that carries no observation time). An observation in the future of
        ``monotonic_now_s`` (a clock the caller did not read) is stamped at the event's time, never later.
    """
    alert = event.alert
    observed = None if alert is None else alert.get("observed_at_s")
    if alert is None or isinstance(observed, bool) or not isinstance(observed, (int, float)):
        return event
    age_s = max(0.0, monotonic_now_s - float(observed))
    epoch_s = round(event.time_ms / 1000 - age_s, 3)
    return dataclasses.replace(event, alert={**alert, "observed_at_epoch_s": epoch_s})


def stamping_observed_epoch(emit: Callable[[AuditEvent], None],
                            monotonic: Callable[[], float] = time.monotonic) -> Callable[[AuditEvent], None]:
    """An ``on_alert`` callback that emits each event with :func:`with_observed_epoch` applied; ``monotonic``
    must be the monitor's clock (the gateway's: :func:`time.monotonic`)."""

    def on_alert(event: AuditEvent) -> None:
        emit(with_observed_epoch(event, monotonic()))

    return on_alert
