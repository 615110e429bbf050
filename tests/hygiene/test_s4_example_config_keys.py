"""Review R4-7: README says every option is in examples/gateway.yaml. Every key the config schema
accepts (the pydantic sections, the routing policies' parameters, the tenant entry) must appear in
the example's block of its top-level section, set or commented out (``# key: value``)."""
from __future__ import annotations

import re
import typing
from pathlib import Path

from pydantic import BaseModel

from gateway.config import GatewayConfig
from tenancy import tenant_schema

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gateway.yaml"


def _models(annotation: object) -> list[type[BaseModel]]:
    """Pydantic models inside an annotation (Optional, list, Annotated unions ...), depth-first."""
    out: list[type[BaseModel]] = []
    stack = [annotation]
    while stack:
        a = stack.pop()
        if isinstance(a, type) and issubclass(a, BaseModel):
            out.append(a)
        stack.extend(typing.get_args(a))
    return out


def _walk(model: type[BaseModel], prefix: str, out: set[str]) -> None:
    for name, field in model.model_fields.items():
        out.add(prefix + name)
        for sub in _models(field.annotation):
            _walk(sub, prefix + name + ".", out)


def accepted_keys() -> set[str]:
    """Dotted paths of every accepted key, e.g. ``routing.policy.epsilon``, ``tenancy.tenants.rate_rps``."""
    out: set[str] = set()
    _walk(GatewayConfig, "", out)
    for obj in vars(tenant_schema).values():
        if isinstance(obj, type) and issubclass(obj, BaseModel) and obj.__module__ == tenant_schema.__name__:
            _walk(obj, "tenancy.tenants.", out)
    return out


def section_blocks(text: str) -> dict[str, str]:
    """Top-level section name -> its lines, with ``# key:`` comments uncommented."""
    blocks: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"^(\w+):", line)
        if m:
            current = m.group(1)
        if current is not None:
            blocks.setdefault(current, []).append(re.sub(r"^(\s*)#\s?", r"\1", line))
    return {k: "\n".join(v) for k, v in blocks.items()}


def test_every_accepted_key_is_in_the_example_under_its_section() -> None:
    blocks = section_blocks(EXAMPLE.read_text(encoding="utf-8"))
    missing = []
    for path in sorted(accepted_keys()):
        section, leaf = path.split(".")[0], path.split(".")[-1]
        block = blocks.get(section, "")
        if not re.search(r"(^|[\s{,])" + re.escape(leaf) + r"\s*:", block, re.M):
            missing.append(path)
    assert not missing, f"keys accepted by the schema but not in examples/gateway.yaml: {missing}"


def test_the_walk_sees_nested_and_tenant_keys() -> None:
    keys = accepted_keys()
    assert {"routing.policy.epsilon", "audit.concentration.attribution_max_tenants",
            "tenancy.tenants.output_tokens_burst", "flow.tenant_max_in_flight_requests"} <= keys
