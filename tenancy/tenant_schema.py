"""The pydantic schema of one ``tenancy.tenants`` entry (:class:`TenantEntry`).

Field shapes and limits live here; :func:`tenancy.tenant.parse_tenant` validates an
entry with it and turns the first pydantic error into a
:class:`tenancy.tenant.TenantConfigError` reading ``tenants.<i>.<key>: <meaning>``
(docs/configuration.md). Unknown keys are refused (``extra="forbid"``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

TENANT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$"

_Name = Annotated[StrictStr, Field(pattern=NAME_PATTERN)]
_PositiveNumber = Annotated[StrictInt | StrictFloat, Field(gt=0, allow_inf_nan=False)]
_PositiveInt = Annotated[StrictInt, Field(gt=0)]

#: The meaning reported for a bad value of each field (by top-level key).
FIELD_MESSAGES: dict[str, str] = {
    "id": "must match [A-Za-z0-9][A-Za-z0-9._-]{0,63}",
    "spiffe_ids": "must be a non-empty list of SPIFFE IDs or prefixes",
    "models": "must be a list of names",
    "pools": "must be a list of names",
    "tier": "must be a non-empty name",
    "labels": "must map non-empty strings to strings",
    "regulated": "must be true or false",
    "allow_prompt_logprobs": "must be true or false",
    "data_residency": "must be a region name",
    "forward_user": "must be 'drop' or 'pseudonym'",
    "usage_cached_tokens": "must be 'pass' or 'drop'",
    "json_schema_limits": "must map max_pattern_chars to an integer >= 0, max_regex_chars to a positive integer or "
                          "null (not checked), max_item_count and max_pattern_states to a positive integer or null, "
                          "and max_bytes, "
                          "max_depth, max_properties, max_enum_values, max_tool_schemas_bytes to positive "
                          "integers, and quote_reading_patterns to 'refuse' or 'allow'",
    **{k: "must be a positive finite number" for k in (
        "rate_rps", "rate_burst", "prompt_tokens_per_s", "prompt_tokens_burst",
        "output_tokens_per_s", "output_tokens_burst", "refused_cpu_ms_per_s", "refused_cpu_burst_ms")},
    **{k: "must be a positive integer" for k in (
        "max_concurrency", "max_prompt_tokens", "max_output_tokens",
        "max_prompt_bytes", "max_messages", "max_batch_prompts")},
}
#: The meaning reported for a bad list element (``<key>.<i>``).
ITEM_MESSAGES: dict[str, str] = {
    "models": "must be a name of [A-Za-z0-9._:/@+-], at most 128 chars",
    "pools": "must be a name of [A-Za-z0-9._:/@+-], at most 128 chars",
    "spiffe_ids": "must be a SPIFFE ID or prefix (a string)",
}


class JsonSchemaLimitsEntry(BaseModel):
    """A tenant's own bounds on a chat body's ``response_format`` schema (session 24, S23-fields-2), each
    overriding ``limits.json_schema.<name>`` (units: gateway/response_format.py). Unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_bytes: _PositiveInt | None = None
    max_depth: _PositiveInt | None = None
    max_properties: _PositiveInt | None = None
    max_enum_values: _PositiveInt | None = None
    max_pattern_chars: Annotated[StrictInt, Field(ge=0)] | None = None
    max_tool_schemas_bytes: _PositiveInt | None = None
    #: session 27 (expand27): an explicit null turns the bound off for this tenant (omitted: the gateway's value)
    max_regex_chars: _PositiveInt | None = None
    #: session 29 (pattern29, S29-pattern29-1): "allow" turns the check off for this tenant (xgrammar, llguidance)
    quote_reading_patterns: Literal["refuse", "allow"] | None = None
    #: session 29 (xgrammar29): the largest minItems/maxItems/minProperties/maxProperties; null: off for this tenant
    max_item_count: _PositiveInt | None = None
    #: session 30 (pattern30): the states of a schema's patterns' automata together; null: off for this tenant
    max_pattern_states: _PositiveInt | None = None


class TenantEntry(BaseModel):
    """One ``tenancy.tenants`` entry as written in the configuration (units: docs/tenancy.md).

    Values are checked strictly (no string-to-number coercion, booleans are not numbers).
    Cross-field rules (a burst needs its rate, ``max_batch_prompts`` <= ``max_concurrency``)
    and SPIFFE-rule parsing are applied by :func:`tenancy.tenant.parse_tenant`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Annotated[StrictStr, Field(pattern=TENANT_ID_PATTERN)]
    spiffe_ids: Annotated[list[StrictStr], Field(min_length=1)]
    models: list[_Name] = []
    pools: list[_Name] = []
    tier: _Name = "standard"
    labels: dict[Annotated[StrictStr, Field(min_length=1)], StrictStr] = {}
    rate_rps: _PositiveNumber | None = None
    rate_burst: _PositiveNumber | None = None
    prompt_tokens_per_s: _PositiveNumber | None = None
    prompt_tokens_burst: _PositiveNumber | None = None
    output_tokens_per_s: _PositiveNumber | None = None
    output_tokens_burst: _PositiveNumber | None = None
    refused_cpu_ms_per_s: _PositiveNumber | None = None
    refused_cpu_burst_ms: _PositiveNumber | None = None
    max_concurrency: _PositiveInt | None = None
    max_prompt_tokens: _PositiveInt | None = None
    max_output_tokens: _PositiveInt | None = None
    max_prompt_bytes: _PositiveInt | None = None
    max_messages: _PositiveInt | None = None
    max_batch_prompts: _PositiveInt | None = None
    forward_user: Literal["drop", "pseudonym"] | None = None
    usage_cached_tokens: Literal["pass", "drop"] | None = None
    allow_prompt_logprobs: StrictBool = False
    regulated: StrictBool = False
    data_residency: _Name | None = None
    json_schema_limits: JsonSchemaLimitsEntry | None = None
