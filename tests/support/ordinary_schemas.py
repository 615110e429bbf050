"""Ordinary tool and response schemas, written by hand after OpenAI's function-calling and Structured Outputs
examples and common client libraries (pydantic's ``Optional`` fields: ``anyOf`` with ``null``, not required), for
``limits.json_schema.max_regex_chars`` (session 27, expand27, S27-review27-3): the default must pass each of them, and
all of them together as one body's tools. Shapes: 1-60 properties, required or not, nested objects 3-4 deep, arrays
of objects, enums, formats, free-form ``object`` values, ``$defs`` with a recursive node."""

from __future__ import annotations

from typing import Any

S: dict[str, Any] = {"type": "string"}
I: dict[str, Any] = {"type": "integer"}
N: dict[str, Any] = {"type": "number"}
B: dict[str, Any] = {"type": "boolean"}


def _obj(props: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props, **extra}
    if required is not None:
        out["required"] = required
    return out


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}], "default": None}


ADDRESS = _obj({"street": S, "city": S, "state": S, "postal_code": S, "country": {"type": "string", "enum": [
    "US", "CA", "MX", "GB", "DE", "FR", "JP", "IN", "BR", "AU"]}})

ORDINARY: dict[str, dict[str, Any]] = {
    "get_weather": _obj({"location": {"type": "string", "description": "City and state, e.g. San Francisco, CA"},
                         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["location"]),
    "math_reasoning (strict)": _obj({
        "steps": {"type": "array", "items": _obj({"explanation": S, "output": S}, ["explanation", "output"],
                                                 additionalProperties=False)},
        "final_answer": S}, ["steps", "final_answer"], additionalProperties=False),
    "create_contact (15 optional)": _obj({
        "name": S, "email": {"type": "string", "format": "email"}, "phone": S, "company": S, "title": S,
        "address": ADDRESS, "tags": {"type": "array", "items": S}, "notes": S,
        "source": {"type": "string", "enum": ["web", "referral", "event", "cold_call", "partner"]},
        "lead_score": {"type": "integer", "minimum": 0, "maximum": 100},
        "birthday": {"type": "string", "format": "date"},
        "linkedin": {"type": "string", "format": "uri"}, "owner_id": S,
        "status": {"type": "string", "enum": ["new", "contacted", "qualified", "lost", "customer"]},
        "custom_fields": {"type": "object", "additionalProperties": S}}),
    "search_flights": _obj({
        "origin": S, "destination": S, "depart_date": {"type": "string", "format": "date"},
        "return_date": {"type": "string", "format": "date"},
        "passengers": _obj({"adults": I, "children": I, "infants": I}, ["adults"]),
        "cabin": {"type": "string", "enum": ["economy", "premium_economy", "business", "first"]},
        "max_price": N, "airlines": {"type": "array", "items": S}, "nonstop": B},
        ["origin", "destination", "depart_date"]),
    "update_settings (60 optional)": _obj({f"setting_{i:02d}_{kind}": {"string": S, "integer": I, "boolean": B}[kind]
                                           for i in range(60) for kind in [("string", "integer", "boolean")[i % 3]]}),
    "register_user (60 required)": _obj({f"field_{i:02d}": S for i in range(60)},
                                        [f"field_{i:02d}" for i in range(60)]),
    "order (4 levels)": _obj({
        "order_id": S, "created_at": {"type": "string", "format": "date-time"},
        "customer": _obj({"id": S, "name": S, "email": {"type": "string", "format": "email"},
                          "shipping": _obj({"address": ADDRESS, "geo": _obj({"lat": N, "lon": N}, ["lat", "lon"])},
                                           ["address"])}, ["id", "name"]),
        "line_items": {"type": "array", "minItems": 1, "items": _obj({
            "sku": S, "quantity": I, "unit_price": N,
            "discounts": {"type": "array", "items": _obj({"code": S, "amount": N}, ["code", "amount"])}},
            ["sku", "quantity", "unit_price"])},
        "total": N, "currency": {"type": "string", "enum": ["USD", "EUR", "GBP", "JPY"]}},
        ["order_id", "customer", "line_items", "total"]),
    "tree ($defs, recursive)": {"$defs": {"node": _obj({"name": S, "value": N, "children": {
        "type": "array", "items": {"$ref": "#/$defs/node"}}}, ["name"])}, "$ref": "#/$defs/node"},
    "extract_entities": _obj({"people": {"type": "array", "items": _obj({
        "name": S, "role": {"type": "string", "enum": [f"role_{i}" for i in range(20)]},
        "mentions": {"type": "array", "items": _obj({"start": I, "end": I}, ["start", "end"])}}, ["name"])},
        "organizations": {"type": "array", "items": S}, "locations": {"type": "array", "items": S},
        "sentiment": {"type": "string", "enum": ["positive", "neutral", "negative"]}}, ["people"]),
    "pydantic (25 Optional fields)": _obj({f"attribute_{i}": _nullable([S, I, N, B][i % 4]) for i in range(25)}),
    "run_sql": _obj({"query": S, "params": {"type": "array", "items": {"anyOf": [S, N, B, {"type": "null"}]}},
                     "timeout_ms": {"type": "integer", "maximum": 60000}, "read_only": B}, ["query"]),
    "create_event": _obj({
        "title": S, "start": {"type": "string", "format": "date-time"},
        "end": {"type": "string", "format": "date-time"},
        "attendees": {"type": "array", "items": _obj({"email": {"type": "string", "format": "email"},
                                                       "optional": B}, ["email"])},
        "recurrence": _obj({"frequency": {"type": "string", "enum": ["daily", "weekly", "monthly", "yearly"]},
                            "interval": I, "until": {"type": "string", "format": "date"},
                            "by_day": {"type": "array", "items": {"type": "string", "enum": [
                                "MO", "TU", "WE", "TH", "FR", "SA", "SU"]}}}, ["frequency"]),
        "location": S, "description": S, "metadata": {"type": "object"}}, ["title", "start", "end"]),
    "log_event (free-form metadata)": _obj({"level": {"type": "string", "enum": ["debug", "info", "warning", "error"]},
                                            "message": S, "logger": S, "timestamp": S,
                                            "context": {"type": "object"}, "extra": {"type": "object"}}),
}
