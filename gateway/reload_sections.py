"""Which parts of a re-read configuration file a tenants reload does not apply (S23-newcomer-5).

``POST /admin/tenants/reload`` applies ``tenancy.tenants`` and ``tenancy.operators`` only; every
other setting is read at start. Before session 23 a reload of a file whose other sections had changed
answered 200 and ignored them without a word; the reload answer now names them (names only, never
values: a section may hold a secret's path or a token).
"""
from __future__ import annotations

from gateway.config import GatewayConfig

__all__ = ["RELOADED_TENANCY_FIELDS", "not_applied_sections"]

#: the ``tenancy`` fields a reload applies
RELOADED_TENANCY_FIELDS = frozenset({"tenants", "operators"})


def not_applied_sections(running: GatewayConfig, fresh: GatewayConfig) -> list[str]:
    """Sorted names of the settings that differ between ``running`` (the configuration the gateway
    started with) and ``fresh`` (the file re-read) and that a reload does not apply: a top-level section
    (``limits``, ``replicas``, ...) or, inside ``tenancy``, a field other than ``tenants`` /
    ``operators`` (``tenancy.usage_cached_tokens``, ...). Empty when only tenants or operators changed."""
    old, new = running.model_dump(mode="json"), fresh.model_dump(mode="json")
    out: list[str] = []
    for name in sorted(old.keys() | new.keys()):
        if name == "tenancy":
            t_old, t_new = old.get(name) or {}, new.get(name) or {}
            out += [f"tenancy.{f}" for f in sorted(t_old.keys() | t_new.keys())
                    if f not in RELOADED_TENANCY_FIELDS and t_old.get(f) != t_new.get(f)]
        elif old.get(name) != new.get(name):
            out.append(name)
    return out
