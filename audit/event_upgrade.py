"""Reading audit events of schema versions "1" and "2": their field names renamed to version "3"
(split out of :mod:`audit.event`, session 25; :meth:`audit.event.AuditEvent.from_dict` calls it).
A pure function of a dict, no I/O."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["upgrade_event_dict"]

#: Version "1"/"2" names → version "3" names: (group or None, old name, new group or None, new name).
_RENAMED_V3: tuple[tuple[str | None, str, str | None, str], ...] = (
    (None, "cached_tokens", "route", "delivered_prefix_tokens"),
    ("route", "prefix_tokens_matched", "route", "predicted_prefix_tokens"),
    ("route", "prefix_tokens_available", "route", "available_prefix_tokens"),
    ("latency", "ttft_ms", "latency", "first_byte_ms"),
)


def upgrade_event_dict(data: Mapping[str, Any]) -> dict[str, Any]:
    """A version "1" or "2" event dict with its fields renamed to version "3" (a new dict;
    ``schema_version`` stays as read). Unknown fields are left for :meth:`AuditEvent.from_dict` to refuse.
    A field whose new group is present but not an object (``"route": null``, crafted) stays under its old
    name, so :meth:`AuditEvent.from_dict` refuses the record rather than the value vanishing (S26-review26-10)."""
    out: dict[str, Any] = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in data.items()}
    for group, old, new_group, new in _RENAMED_V3:
        src = out if group is None else out.get(group)
        if not isinstance(src, dict) or old not in src:
            continue
        dst = out if new_group is None else out.setdefault(new_group, {})
        if not isinstance(dst, dict):
            continue
        value = src.pop(old)
        if group is not None and not src and group != new_group:
            out.pop(group)
        dst[new] = value
    return out
