"""The schemas a replica builds from a chat body's ``tools`` before compiling them (session 30, attack30,
S30-attack30-2), in which a tool's ``$ref`` is also resolved: vLLM's ``tool_choice: "required"`` schema
(:func:`gateway.schema_expansion.required_schema`: an ``anyOf`` of every tool, their ``$defs`` merged at its top and
removed from each tool) and SGLang's (``function_call/utils.py`` ``get_json_schema_constraint``: the same shape with
each tool's ``parameters`` kept whole, and an array of one tool for a named ``tool_choice``). A reference that
reaches into another tool, or through the wrapper into its own tool's data, must be walked there too
(gateway/schema_walk.py ``walk_bounds``). Pure functions over the decoded body; nothing deep-copied.
"""

from __future__ import annotations

from typing import Any

from gateway.schema_expansion import required_schema

__all__ = ["required_schema", "sglang_schemas", "wrapper_nodes"]


def sglang_schemas(tools: list[Any]) -> tuple[dict[str, Any], list[dict[str, Any] | None]]:
    """SGLang's schemas of a body's ``tools`` (``function_call/utils.py`` ``get_json_schema_constraint``; session 30,
    S30-attack30-2): its ``tool_choice: "required"`` schema, vLLM's shape (:func:`required_schema`) with each tool's
    ``parameters`` kept whole (its ``$defs`` too, as well as merged at the top), and per entry of ``tools`` its named
    choice's schema ``{"type": "array", "minItems": 1, "items": <that tool's member>}`` (None for an entry that is no
    function object). Built of references to the client's dicts. Raises nothing."""
    members: list[dict[str, Any]] = []
    named: list[dict[str, Any] | None] = []
    defs: dict[str, Any] = {}
    for tool in tools:
        fn = tool.get("function") if type(tool) is dict else None
        if type(fn) is not dict:
            named.append(None)
            continue
        params = fn.get("parameters")
        if type(params) is dict and params:
            if type(own := params.get("$defs")) is dict:
                for name, value in own.items():
                    defs.setdefault(name, value)
        else:
            params = {"type": "object", "properties": {}}
        member = {"properties": {"name": {"type": "string", "enum": [fn.get("name")]}, "parameters": params},
                  "required": ["name", "parameters"]}
        members.append(member)
        named.append({"type": "array", "minItems": 1, "items": member})
    wrapper: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": members}}
    if defs:
        wrapper["$defs"] = defs
    return wrapper, named


def wrapper_nodes(wrapper: dict[str, Any]) -> set[int]:
    """The ids of the containers :func:`required_schema` or :func:`sglang_schemas` built itself in ``wrapper`` (its
    root, ``items``, the ``anyOf`` list, each member with its ``properties``, ``name`` schema, ``enum`` and
    ``required``, each ``parameters`` copy or stand-in, or the client's own ``parameters``, walked as a root anyway),
    not the client's objects they hold. The merged ``$defs`` map is left out: as a reference's target it is a schema
    no tool holds (session 30, S30-attack30-2). Raises nothing."""
    items = wrapper["items"]
    ids = {id(wrapper), id(items)}
    members = items["anyOf"] if "anyOf" in items else [items]
    if "anyOf" in items:
        ids.add(id(members))
    for member in members:
        props = member["properties"]
        ids.update((id(member), id(props), id(props["name"]), id(props["name"]["enum"]), id(member["required"]),
                    id(props["parameters"])))
    return ids
