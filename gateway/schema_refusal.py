"""The 400 a JSON-schema bound answers and the client's path it names (moved out of gateway/response_format.py in
session 30, pattern30, to keep that module under 400 lines; the same code)."""

from __future__ import annotations

from typing import Any, Optional

from gateway.errors import GatewayError
from gateway.unknown_fields import field_label

__all__ = ["MAX_PARAM_CHARS", "Node", "path_node", "path_param", "refused"]

#: the longest ``param`` of a refusal (characters)
MAX_PARAM_CHARS = 1024
#: a walked value's path: ``(parent node, key or list index)``, None above the root (session 25, S25-review-2)
Node = Optional[tuple[Any, Any]]


def path_node(path: tuple[str, ...]) -> Node:
    """The path node of ``path`` (:data:`_Node`: ``(parent node, key)``, None above the root)."""
    node: Node = None
    for name in path:
        node = (node, name)
    return node


def path_param(node: Node) -> str:
    """The path of ``node`` as the error's ``param``: dotted, each client key as :func:`field_label` shows it (the
    fixed names and list indexes are plain ASCII already); cut to :data:`MAX_PARAM_CHARS` (``...`` marks a cut)."""
    parts: list[str] = []
    while node is not None:
        node, key = node
        parts.append(str(key) if type(key) is int else key)
    parts.reverse()
    param = ".".join(p if p.isascii() and (p.isidentifier() or p.isdigit()) else field_label(p) for p in parts)
    return param if len(param) <= MAX_PARAM_CHARS else param[:MAX_PARAM_CHARS - 3] + "..."


def refused(param: str, message: str, name: str, what: str = "response_format") -> GatewayError:
    """The 400 ``json_schema_too_complex`` naming the bound ``name`` (``limits.json_schema.<name>``) in its message and
    its audit ``reason`` (``what``: ``response_format`` or ``tools parameters``; no client text there)."""
    return GatewayError(400, "json_schema_too_complex", f"{message} (limits.json_schema.{name}, for this tenant); the "
                        "replica compiles it into a grammar before the first token", param=param,
                        record={"reason": f"{what} over limits.json_schema.{name}"}, client_text=True)
