"""Bounds on a chat body's forwarded free-form fields, checked on the decoded JSON before schema validation
(session 22, S22-review-4).

``tools``, ``tool_choice``, ``response_format`` and messages' ``tool_calls`` are forwarded as the client sent
them (``dict[str, Any]`` in gateway/request_schema.py) and rendered as compact JSON into the prompt's
``extra_text`` (gateway/request.py). Their cost (validation, the nesting walk, ``model_dump``, the rendering)
grows with their count of JSON values: 30,000 one-key tools (360 kB, under ``limits.max_json_items``) cost
~110 ms of gateway CPU before ``context_length_exceeded``. Two bounds answer first:

* ``max_tools`` (``limits.max_tools``, default 128: OpenAI's documented bound of tools per request): a longer
  ``tools`` list is refused reading its length only (400 ``too_many_tools``);
* ``max_values`` (:attr:`tenancy.bounds.RequestBounds.max_free_values`): more keys and values in those fields
  than a prompt the tenant may send can hold (each renders at least one byte, and at least one token with the
  ``word`` tokenizer) is refused after counting at most ``max_values + 1`` of them (400
  ``too_many_json_items``). A body refused here would have been refused ``prompt_too_large`` or
  ``context_length_exceeded`` after the costly steps, so no admissible body is refused.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import GatewayError

__all__ = ["free_form_refusal", "count_values", "FREE_FORM_FIELDS"]

#: the chat body's forwarded free-form fields (each message's ``tool_calls`` too)
FREE_FORM_FIELDS = ("tools", "tool_choice", "response_format")


def count_values(roots: list[Any], stop: int) -> int:
    """JSON values and object keys in ``roots`` (decoded JSON; each root counts as one value), counted until
    the count passes ``stop``: the exact count when it is at most ``stop``, else a number above ``stop``.
    Work O(min(count, stop)). Raises nothing."""
    stack = list(roots)
    count = len(stack)
    while stack and count <= stop:
        cur = stack.pop()
        if type(cur) is dict:
            count += 2 * len(cur)  # a key and its value
            if count <= stop:
                stack.extend(cur.values())
        elif type(cur) is list:
            count += len(cur)
            if count <= stop:
                stack.extend(cur)
    return count


def free_form_refusal(data: dict[str, Any], max_tools: int | None, max_values: int | None,
                      body_bytes: int) -> GatewayError | None:
    """The 400 for the decoded chat body ``data`` whose ``tools`` list has more than ``max_tools`` entries
    (``too_many_tools``, param ``tools``), or whose free-form fields (:data:`FREE_FORM_FIELDS`, messages'
    ``tool_calls``) hold more than ``max_values`` keys and values (``too_many_json_items``); else None.
    ``None`` bounds: not checked. ``body_bytes``: the length of the JSON text ``data`` was decoded from; each key
    and value starts at a byte of its own there, so a body of at most ``max_values`` bytes is not walked (an
    ordinary tool-using body: no cost). Types are not checked here (the schema does). Raises nothing."""
    tools = data.get("tools")
    if max_tools is not None and type(tools) is list and len(tools) > max_tools:
        return GatewayError(400, "too_many_tools", f"tools has {len(tools)} entries; at most {max_tools} tools per "
                            "request (limits.max_tools)", param="tools", client_text=True)
    if max_values is None or body_bytes <= max_values:
        return None
    roots = [data[k] for k in FREE_FORM_FIELDS if data.get(k) is not None]
    messages = data.get("messages")
    if type(messages) is list:
        roots += [m["tool_calls"] for m in messages if type(m) is dict and m.get("tool_calls") is not None]
    if roots and count_values(roots, max_values) > max_values:
        return GatewayError(400, "too_many_json_items", "tools, tool_choice, response_format and tool_calls hold "
                            f"more than {max_values} JSON values together: more than this tenant's prompt can hold "
                            "(max_prompt_tokens, max_prompt_bytes)")
    return None
