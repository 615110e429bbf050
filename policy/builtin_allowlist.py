"""The built-ins a Rego module may call: the default allow-list and its extension by ``policy.allowed_builtins``.

The default list (:data:`DEFAULT_ALLOWED_BUILTINS`) holds the pure,
deterministic built-ins that do no I/O (OPA's built-in reference,
https://www.openpolicyagent.org/docs/policy-reference/builtins). Left out:
``http.send``, ``net.lookup_ip_addr`` (network); ``opa.runtime`` (host
environment); ``rego.parse_module`` (not needed by a policy);
``json.verify_schema`` / ``json.match_schema`` (a schema ``$ref`` may be
fetched over the network); ``time.now_ns``, ``rand.intn``, ``uuid.rfc4122``
(non-deterministic; decisions are cached, so a policy reads the time from
``input.time``); ``print``, ``trace`` (write to the gateway's stderr);
``io.jwt.encode_sign*``, ``providers.aws.sign_req`` (signing; not needed);
``graphql.*`` (not needed). ``policy.allowed_builtins`` extends the list.

Used by :func:`policy.builtins.check_modules`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_OPERATORS = {
    # infix operators as the parser names them
    "eq", "assign", "equal", "neq", "lt", "lte", "gt", "gte",
    "plus", "minus", "mul", "div", "rem", "and", "or",
    # the parser's names for ``x in xs`` / ``k, v in xs`` and template strings
    "internal.member_2", "internal.member_3", "internal.template_string",
}
_NUMBERS = {"abs", "ceil", "floor", "round", "numbers.range", "numbers.range_step", "to_number", "format_int"}
_AGGREGATES = {"count", "sum", "product", "max", "min", "sort", "all", "any"}
_COLLECTIONS = {
    "array.concat", "array.slice", "array.reverse", "intersection", "union",
    "object.get", "object.remove", "object.subset", "object.union", "object.union_n", "object.filter",
    "object.keys", "json.filter", "json.remove", "json.patch", "walk",
    "graph.reachable", "graph.reachable_paths",
}
_STRINGS = {
    "concat", "contains", "endswith", "indexof", "indexof_n", "lower", "upper", "replace", "split",
    "sprintf", "startswith", "substring", "trim", "trim_left", "trim_prefix", "trim_right",
    "trim_suffix", "trim_space", "strings.any_prefix_match", "strings.any_suffix_match",
    "strings.count", "strings.replace_n", "strings.reverse", "strings.render_template",
}
_REGEX_GLOB = {
    "regex.match", "re_match", "regex.is_valid", "regex.split", "regex.find_n",
    "regex.find_all_string_submatch_n", "regex.globs_match", "regex.template_match", "regex.replace",
    "glob.match", "glob.quote_meta",
}
_TYPES = {
    "is_number", "is_string", "is_boolean", "is_array", "is_set", "is_object", "is_null", "type_name",
}
_ENCODING = {
    "base64.encode", "base64.decode", "base64.is_valid", "base64url.encode", "base64url.encode_no_pad",
    "base64url.decode", "urlquery.encode", "urlquery.encode_object", "urlquery.decode",
    "urlquery.decode_object", "json.marshal", "json.marshal_with_options", "json.unmarshal",
    "json.is_valid", "yaml.marshal", "yaml.unmarshal", "yaml.is_valid", "hex.encode", "hex.decode",
}
_CRYPTO_TOKENS = {
    "crypto.md5", "crypto.sha1", "crypto.sha256",
    "crypto.hmac.md5", "crypto.hmac.sha1", "crypto.hmac.sha256", "crypto.hmac.sha512", "crypto.hmac.equal",
    "crypto.x509.parse_certificates", "crypto.x509.parse_and_verify_certificates",
    "crypto.x509.parse_and_verify_certificates_with_options", "crypto.x509.parse_certificate_request",
    "crypto.x509.parse_keypair", "crypto.x509.parse_rsa_private_key", "crypto.parse_private_keys",
    "io.jwt.decode", "io.jwt.decode_verify",
    "io.jwt.verify_es256", "io.jwt.verify_es384", "io.jwt.verify_es512",
    "io.jwt.verify_hs256", "io.jwt.verify_hs384", "io.jwt.verify_hs512",
    "io.jwt.verify_ps256", "io.jwt.verify_ps384", "io.jwt.verify_ps512",
    "io.jwt.verify_rs256", "io.jwt.verify_rs384", "io.jwt.verify_rs512", "io.jwt.verify_eddsa",
}
_MISC = {
    "bits.or", "bits.and", "bits.negate", "bits.xor", "bits.lsh", "bits.rsh",
    "units.parse", "units.parse_bytes", "semver.is_valid", "semver.compare", "uuid.parse",
    "net.cidr_contains", "net.cidr_contains_matches", "net.cidr_expand", "net.cidr_intersects",
    "net.cidr_is_valid", "net.cidr_merge", "net.cidr_overlap",
    # time arithmetic on given values (no clock read)
    "time.parse_ns", "time.parse_rfc3339_ns", "time.parse_duration_ns", "time.format", "time.date",
    "time.clock", "time.weekday", "time.add_date", "time.diff",
    "rego.metadata.chain", "rego.metadata.rule",
}

#: Built-ins every module may call (pure, deterministic, no I/O).
DEFAULT_ALLOWED_BUILTINS: frozenset[str] = frozenset(
    _OPERATORS | _NUMBERS | _AGGREGATES | _COLLECTIONS | _STRINGS | _REGEX_GLOB | _TYPES
    | _ENCODING | _CRYPTO_TOKENS | _MISC
)

_NAME = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*$")


def check_builtin_name(name: str) -> str:
    """Validate one ``policy.allowed_builtins`` entry (a dotted lower-case name).

    Raises:
        ValueError: not a dotted name such as ``net.lookup_ip_addr``.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"invalid built-in name {name!r} (expected a dotted name like 'time.now_ns')")
    return name


def allowed_builtins(extra: Iterable[str] = ()) -> frozenset[str]:
    """The default allow-list plus ``extra`` (each checked by :func:`check_builtin_name`).

    Raises:
        ValueError: an invalid name in ``extra``.
    """
    return DEFAULT_ALLOWED_BUILTINS | {check_builtin_name(n) for n in extra}
