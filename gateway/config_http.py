"""The HTTP side of the configuration: listeners, the HTTP server, request limits, upstream timeouts and retries."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gateway.config_base import ConfigSection


class ListenConfig(ConfigSection):
    """Address of a listener (``port`` 0 picks a free port)."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)


class ServerConfig(ConfigSection):
    """The HTTP server of both listeners (uvicorn).

    ``http_parser``: ``httptools`` (default; C, llhttp) or ``h11`` (pure
    Python, slower). Both enforce the same framing rules (gateway/framing.py,
    tests/hostile/test_i10_http_framing.py) and the gateway's head guard
    refuses the same things under both (Upgrade, ``CONNECT``, ``#`` targets,
    ``Host`` rules, non-standard methods, the field count). They still differ
    on some malformed or lenient request forms, each served by one parser and
    refused (400) by the other: absolute-form targets, double spaces, HTTP/0.9
    request lines, other protocols and versions, a leading CRLF, repeated equal
    ``Content-Length``, bare-LF chunk lines, bare-LF request heads (h11 serves,
    httptools refuses); the table is docs/configuration.md, ``server.http_parser``.

    ``max_connections_per_source``: per listener, the most open connections
    from one source IP (the socket peer); one more answers a JSON 503
    ``too_many_connections`` at once and is closed (gateway/http_guard.py).
    ``None`` (default): no per-source cap, only ``limits.max_connections``.

    ``listener_per_worker``: with ``serve --workers N``, give each worker its own
    ``SO_REUSEPORT`` public listening socket so the kernel spreads connections
    across workers (Linux; elsewhere, or ``False``: one socket shared by all
    workers; gateway/workers.py).

    ``client_send_buffer_bytes``: SO_SNDBUF of each accepted client socket (bytes, >= 4096; Linux
    doubles it), so the kernel cannot absorb a whole answer for a client that reads nothing and the
    read-rate rules (``limits.client_min_read_bytes_per_s``) see the client (R7b-4); ``None``: the
    kernel's default (autotuned, up to ``tcp_wmem`` max, often 4 MiB; gateway/send_buffer.py).
    """

    http_parser: Literal["httptools", "h11"] = "httptools"
    max_connections_per_source: int | None = Field(None, ge=1)
    listener_per_worker: bool = True
    client_send_buffer_bytes: int | None = Field(131072, ge=4096)


class JsonSchemaLimits(ConfigSection):
    """Bounds on a chat body's ``response_format`` schema, which the replica compiles into a grammar before the
    first token (session 24, S23-fields-2; the walk, the units and the sources of the defaults:
    gateway/response_format.py). ``max_bytes``: compact JSON bytes of ``response_format``; ``max_depth``: schema
    levels; ``max_properties``: entries of all ``properties`` maps; ``max_enum_values``: entries of all ``enum``
    lists; ``max_pattern_chars``: characters of all ``pattern`` strings and ``patternProperties`` keys. The same
    bounds apply to each ``tools[].function.parameters`` schema, and ``max_tool_schemas_bytes`` to the compact
    JSON bytes of all of them together (session 25) and to their sum once their local ``$ref`` are inlined
    (session 26, S26-review26-4); ``max_bytes`` also bounds each schema so inlined (S25-review-5).
    ``max_regex_chars`` (session 27, expand27, S27-review27-3): characters of the regular expression a compiler that
    inlines the schema (outlines-core) builds from each schema, and, for a body whose ``tool_choice`` is
    ``"required"``, from the tools together as vLLM's schema for it (an upper bound: gateway/schema_expansion.py); ``None``: not checked (replicas that compile
    with xgrammar or llguidance, which do not expand). ``quote_reading_patterns`` (session 29, pattern29,
    S29-pattern29-1): ``"refuse"`` refuses a ``pattern`` that can read the string's closing ``"`` in outlines-core's
    inlined expression, and ``format`` ``uri`` / ``email`` (gateway/pattern_quote.py); ``"allow"``: not checked
    (xgrammar, llguidance). ``max_item_count`` (session 29, S29-xgrammar29-1): the largest ``minItems`` /
    ``maxItems`` / ``minProperties`` / ``maxProperties`` value, and since S29-final29-3 ``minContains`` /
    ``maxContains`` (xgrammar's matcher memory and per-token time grow with it), and since session 30 a counted
    repetition in a structural tag's ``grammar`` / ``regex`` content (S30-attack30-7); ``None``: not checked.
    ``max_pattern_states`` (session 30, pattern30, S30-pattern30-1): the states of the automata of every quote-free
    ``pattern`` of a schema together, as gateway/pattern_states.py counts them (outlines-core determinises them;
    default 8,192 since session 31, S31-pattern31-1: each state costs what the vocabulary allows from it);
    ``None``: not checked (xgrammar, llguidance). More
    answers 400 ``json_schema_too_complex``. Each is overridden per tenant by ``tenants[].json_schema_limits``."""

    max_bytes: int = Field(65536, ge=64)
    max_depth: int = Field(20, ge=1, le=256)
    max_properties: int = Field(5000, ge=1)
    max_enum_values: int = Field(1000, ge=1)
    max_pattern_chars: int = Field(1024, ge=0)
    max_tool_schemas_bytes: int = Field(262144, ge=64)
    max_regex_chars: int | None = Field(1_000_000, ge=1)
    quote_reading_patterns: Literal["refuse", "allow"] = "refuse"
    max_item_count: int | None = Field(128, ge=1)
    max_pattern_states: int | None = Field(8192, ge=1)


class LimitsConfig(ConfigSection):
    """Request-size and timing limits of the public listener.

    ``max_body_bytes``: request bodies larger than this answer 413 before they
    are read in full. ``body_read_timeout_s``: a client that trickles its body
    longer than this answers 408; it also bounds the drain below.

    Early answers (401, 429, 413, ... before the body is read; gateway/framing.py,
    gateway/lingering.py, review R5b-2): ``max_drain_bytes``: the rest of a body
    is read and discarded before the answer, keeping the connection, while the
    body's wire bytes (payload plus chunk framing) stay within this; past it the
    answer carries ``Connection: close`` and the connection closes *lingering*:
    write side shut down after the answer, what the client still sends discarded
    unparsed for at most ``lingering_close_bytes`` wire bytes (``null``:
    max(4 x ``max_body_bytes``, 8 MiB); 0: close at once) and
    ``lingering_close_s`` seconds, then closed, so a client uploading its whole
    body before reading still reads the answer.
    A chunked body's framing (chunk-size lines with extensions, CRLFs) may take at
    most ``max_header_bytes`` + 32 bytes per chunk; more answers 400
    ``chunk_framing_too_large`` (R5b-3). ``max_json_depth``: deeper JSON answers 400.
    ``max_messages``: gateway-wide ceiling of chat messages per request (a
    tenant's own bound, derived or set, is never above it); counted on the
    parsed JSON before schema validation (400 ``too_many_messages``).
    ``max_prompt_tokens``: tokens per prompt of a tenant that sets no
    ``max_prompt_tokens`` of its own (``null``: none, the body size cap only);
    a tenant's own value stands, higher or lower (400 ``context_length_exceeded``).
    ``max_json_items``: ceiling of JSON values per body (bounded from above
    by counting ``{``, ``[`` and ``,`` bytes before decoding; 400
    ``too_many_json_items``): decoding, validating and rendering cost grows
    with the number of values, not the bytes.
    ``max_tools``: the most entries of a chat body's ``tools`` list (OpenAI's documented bound is 128;
    ``null``: none); a longer one answers 400 ``too_many_tools`` before schema validation (S22-review-4).
    ``unknown_fields``: what a top-level body field outside the request schema gets (session 23,
    S22-newcomer-3; gateway/unknown_fields.py): ``refuse`` (400 ``unsupported_parameter`` naming it, as
    OpenAI answers) or ``drop`` (forwarded without it; the answer's ``X-PrefixGate-Dropped-Fields-Count`` /
    ``X-PrefixGate-Dropped-Fields`` headers say how many and which, bounded). ``cache_salt`` is neither:
    the gateway replaces it.
    ``json_schema``: bounds on a chat body's ``response_format`` schema (:class:`JsonSchemaLimits`; session 24).
    ``refused_cpu_ms_per_s`` / ``refused_cpu_burst_ms``: each tenant's budget of
    gateway CPU for preparing requests that end refused (parse, tokenize, prefix
    keys; CPU milliseconds refilled per second / bucket capacity in CPU
    milliseconds; per process; ``null`` rate: no budget); a tenant in debt answers
    429 ``cpu_budget_exhausted`` before its body is read (gateway/cpu_budget.py).
    Per-tenant overrides: ``tenants[].refused_cpu_ms_per_s`` / ``refused_cpu_burst_ms``.
    Since session 6 (R6-1, R6-2) the same bucket is charged, when a request ends, all its preparation
    CPU if it never reached a replica (refused, or cancelled while queued), else the part above its
    free allowance: ``prep_cpu_free_ms`` (CPU milliseconds per request) plus
    ``prep_cpu_free_us_per_token`` (CPU microseconds per prompt token reserved).
    Since session 10 (R10-4) a plain answer of ``answer_cpu_meter_bytes`` or more is parsed under
    the meter, and its CPU above ``prep_cpu_free_ms`` plus ``answer_cpu_free_us_per_token`` x the
    answer's completion tokens is charged to the same bucket at once (``logprobs`` answers cost
    ~20 us of parsing per token with 20 alternatives, ~0.02 without).
    Session 11 (gateway/answer_cost.py): ``max_answer_bytes``: the most (decoded) bytes of a plain
    answer; a larger one is not read further (its replica connection is aborted) and answers 502
    ``answer_too_large`` (``null``: no bound; R10b-2: one answer's parse, on the event loop, is bounded
    by it); large answers are parsed one per loop step; a streamed answer's parse is sampled and
    charged to the same bucket (R10b-4). ``max_unsent_answer_bytes_per_tenant``: while a tenant's plain
    answers of 64 KiB or more hold more than this many bytes the server could not send yet (clients
    that do not read), its new requests answer 429 ``unsent_answers_limited`` (``null``: no bound; R10b-5).

    Connection-level bounds, enforced on BOTH listeners under both HTTP
    parsers before any route or authentication (gateway/http_guard.py):
    ``max_header_bytes``: the most bytes of one request head (request line,
    header fields, blank line); larger answers 431 and closes.
    ``client_write_stall_s``: a streamed answer whose client accepts no bytes for this long is ended
    (upstream closed, output relayed so far charged; gateway/write_stall.py, session 6 N-3).
    ``client_min_read_bytes_per_s``: while a stream waits on its client, the client must read at
    least this many bytes per second, with ``client_min_read_window_s`` seconds of slack (``null``:
    no rate bound); ``max_stream_s``: most seconds of one streamed answer (``null``: none) (R6b-3).
    ``protocol_refusal_audits_per_s``: audit events per second and listener for the refusals the
    connection guard makes before any route (431, 408, 503, uvicorn's 400, upgrade/fragment 400;
    ``null``: none; a tenth of it per source first, R7b-3; gateway/protocol_audit.py).
    ``max_header_fields``: the most header fields of one request head; more answer 431
    ``too_many_header_fields`` and close, before the parser reads them (gateway/head_fields.py, R6-3).
    ``header_read_timeout_s``: a request head must be complete this long
    after the connection opened (or after the first byte of a later request
    on a keep-alive connection); otherwise 408 and close.
    ``max_connections``: per listener, open connections plus running
    requests beyond which a new request answers 503 (uvicorn's
    ``limit_concurrency``).
    ``max_body_chunks``: a chunked request body may have at most this many
    chunks plus one per 1024 body bytes received so far (chunks of 1 KiB or
    more always pass); the chunk past the bound answers 400
    ``body_too_fragmented`` and closes, before its data is handled
    (gateway/body_guard.py; a body's parser cost stays per byte, review R5-1).
    Trailer fields of a chunked body answer 400 ``trailers_not_allowed``
    (R5-5).

    Memory of bodies being read, per gateway process, both listeners
    (gateway/body_budget.py, review R5-3): ``max_buffered_body_bytes``: body
    bytes the app may hold for requests whose body is not complete yet;
    ``max_buffered_body_bytes_per_tenant``: the share of one tenant
    (of one source address while no tenant is known; R5b-1). A body part past either answers 503
    ``body_budget_exhausted`` with ``Retry-After`` and closes. The per-tenant
    share must hold one body of ``max_body_bytes`` and not exceed the total.
    """

    max_body_bytes: int = Field(1 << 20, ge=1024)
    body_read_timeout_s: float = Field(10.0, gt=0)
    max_json_depth: int = Field(32, ge=4, le=256)
    max_output_tokens: int = Field(32768, ge=1)
    max_messages: int = Field(2048, ge=1)
    max_prompt_tokens: int | None = Field(8192, ge=1)
    max_json_items: int = Field(65536, ge=64)
    max_tools: int | None = Field(128, ge=1)
    unknown_fields: Literal["refuse", "drop"] = "refuse"
    json_schema: JsonSchemaLimits = Field(default_factory=JsonSchemaLimits)
    refused_cpu_ms_per_s: float | None = Field(100.0, gt=0)
    refused_cpu_burst_ms: float = Field(250.0, gt=0)
    prep_cpu_free_ms: float = Field(1.0, ge=0)
    prep_cpu_free_us_per_token: float = Field(5.0, ge=0)
    answer_cpu_free_us_per_token: float = Field(5.0, ge=0)
    answer_cpu_meter_bytes: int = Field(64 * 1024, ge=0)
    max_answer_bytes: int | None = Field(8 << 20, ge=1024)
    max_unsent_answer_bytes_per_tenant: int | None = Field(32 << 20, ge=0)
    max_header_bytes: int = Field(16 * 1024, ge=1024, le=1 << 20)
    max_header_fields: int = Field(100, ge=8, le=10_000)
    client_write_stall_s: float = Field(60.0, gt=0)
    client_min_read_bytes_per_s: float | None = Field(4096.0, gt=0)
    client_min_read_window_s: float = Field(60.0, gt=0)
    max_stream_s: float | None = Field(None, gt=0)
    protocol_refusal_audits_per_s: float | None = Field(50.0, gt=0)
    header_read_timeout_s: float = Field(10.0, gt=0)
    max_connections: int = Field(2048, ge=1)
    max_body_chunks: int = Field(256, ge=16, le=1 << 20)
    max_buffered_body_bytes: int = Field(256 << 20, ge=1 << 20)
    max_buffered_body_bytes_per_tenant: int = Field(64 << 20, ge=1024)
    max_drain_bytes: int = Field(64 << 10, ge=0)
    lingering_close_bytes: int | None = Field(None, ge=0)
    lingering_close_s: float = Field(5.0, gt=0)

    @model_validator(mode="after")
    def _budget_fits(self) -> LimitsConfig:
        if not self.max_body_bytes <= self.max_buffered_body_bytes_per_tenant <= self.max_buffered_body_bytes:
            raise ValueError("need max_body_bytes <= max_buffered_body_bytes_per_tenant <= max_buffered_body_bytes")
        return self


class UpstreamConfig(ConfigSection):
    """Timeouts and retries of calls to replicas (seconds).

    A request is retried on another allowed replica only before the first
    byte reached the client, at most ``max_attempts`` replicas that received
    it (a refused connection never reached a replica and does not count;
    each replica is tried at most once) and within ``total_timeout_s`` overall.
    """

    connect_timeout_s: float = Field(2.0, gt=0)
    first_byte_timeout_s: float = Field(60.0, gt=0)
    read_timeout_s: float = Field(60.0, gt=0)
    total_timeout_s: float = Field(600.0, gt=0)
    max_attempts: int = Field(2, ge=1, le=5)
    pool_size: int = Field(512, ge=1)
