"""The schemas a replica builds from a chat body's ``tools`` before compiling them (session 30, attack30,
S30-attack30-2), in which a tool's ``$ref`` is also resolved: vLLM's ``tool_choice: "required"`` schema
(:func:`required_schema`: an ``anyOf`` of every tool, their ``$defs`` merged at its top and removed from each
tool) and SGLang's (``function_call/utils.py`` ``get_json_schema_constraint``: the same shape with
each tool's ``parameters`` kept whole, and an array of one tool for a named ``tool_choice``). A reference that
reaches into another tool, or through the wrapper into its own tool's data, must be walked there too
(gateway/schema_walk.py ``walk_bounds``). Pure functions over the decoded body; nothing deep-copied. Both built by
:func:`required_members` (session 31, tidy31: one builder; vLLM's was in gateway/schema_expansion.py, which
re-exports it).
"""

from __future__ import annotations

from typing import Any

__all__ = ["required_members", "required_schema", "sglang_schemas", "wrapper_nodes"]


def required_schema(tools: list[Any]) -> dict[str, Any]:
    """vLLM's ``tool_choice: "required"`` schema of a body's ``tools`` (a list as decoded; entries that are not
    function objects are skipped), which the replica compiles as ONE schema (session 27, attack27, S27-attack27-2):
    an array (``minItems`` 1) whose ``items`` are an object ``anyOf`` of ``{"properties": {"name": {"type":
    "string", "enum": [name]}, "parameters": parameters}, "required": ["name", "parameters"]}`` per tool, a tool
    without ``parameters`` getting ``{"type": "object", "properties": {}}``, and every tool's ``$defs`` merged at its
    top level (the first of two same names kept; vLLM refuses a clash), so that a reference of one tool resolves in
    another's ``$defs`` and ``#`` is the wrapper, as the replica resolves them. Built of references to the client's
    dicts (shallow copies without ``$defs``), nothing deep-copied. Raises nothing."""
    return required_members(tools, whole_parameters=False)[0]


def sglang_schemas(tools: list[Any]) -> tuple[dict[str, Any], list[dict[str, Any] | None]]:
    """SGLang's schemas of a body's ``tools`` (``function_call/utils.py`` ``get_json_schema_constraint``; session 30,
    S30-attack30-2): its ``tool_choice: "required"`` schema, vLLM's shape (:func:`required_schema`) with each tool's
    ``parameters`` kept whole (its ``$defs`` too, as well as merged at the top), and per entry of ``tools`` its named
    choice's schema ``{"type": "array", "minItems": 1, "items": <that tool's member>}`` (None for an entry that is no
    function object). Built of references to the client's dicts. Raises nothing."""
    wrapper, members = required_members(tools, whole_parameters=True)
    return wrapper, [None if m is None else {"type": "array", "minItems": 1, "items": m} for m in members]


def required_members(tools: list[Any], whole_parameters: bool) -> tuple[dict[str, Any], list[dict[str, Any] | None]]:
    """``(wrapper, members)``: the ``tool_choice: "required"`` schema of ``tools`` (:func:`required_schema`'s shape)
    and, per entry of ``tools``, its member of the wrapper's ``anyOf`` (the same dict; None for an entry that is no
    function object). ``whole_parameters``: False, vLLM's (a tool's ``parameters`` holding a ``$defs`` object is
    shallow-copied without it); True, SGLang's (``parameters`` kept whole, its ``$defs`` too as well as merged at the
    top). Built of references to the client's dicts. Raises nothing."""
    members: list[dict[str, Any]] = []
    per_entry: list[dict[str, Any] | None] = []
    defs: dict[str, Any] = {}
    for tool in tools:
        fn = tool.get("function") if type(tool) is dict else None
        if type(fn) is not dict:
            per_entry.append(None)
            continue
        params = fn.get("parameters")
        if type(params) is dict and params:
            if type(own := params.get("$defs")) is dict:
                for name, value in own.items():
                    defs.setdefault(name, value)
                if not whole_parameters:
                    params = {k: v for k, v in params.items() if k != "$defs"}
        else:
            params = {"type": "object", "properties": {}}
        member = {"properties": {"name": {"type": "string", "enum": [fn.get("name")]}, "parameters": params},
                  "required": ["name", "parameters"]}
        members.append(member)
        per_entry.append(member)
    wrapper: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": members}}
    if defs:
        wrapper["$defs"] = defs
    return wrapper, per_entry


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
