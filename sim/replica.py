"""OpenAI-compatible simulated LLM replica (aiohttp) with a real prefix cache.

One replica = one aiohttp app from :func:`create_app`. It answers
``POST /v1/completions`` and ``POST /v1/chat/completions`` (JSON or SSE),
keeps a block-level prefix cache (:class:`sim.kvcache.BlockCache`) and models
time like a single-GPU vLLM/SGLang engine:

* **Prefill**: one FIFO queue per replica, one prefill at a time. When a request
  reaches the head of the queue its block keys are looked up in the cache
  (``cached = matched_blocks × block_size`` tokens); its prefill takes
  ``(prefill_overhead_s + (prompt_tokens − cached) × token_scale /
  prefill_tokens_per_s) × slow_factor`` trace seconds and its blocks are
  inserted when the prefill completes. Queueing under overload shows up as
  TTFT.
* **Prefill, ``replica_model="chunked"``** (``--replica-model chunked``): no
  prefill queue; a request starts prefilling on arrival (cache lookup then,
  blocks inserted when its prefill ends) and the prefills in progress share
  the replica's rate equally (processor sharing: n in progress each advance
  at 1/n of the rate), as chunked prefill batches chunks of several requests
  in one engine step (vLLM's and SGLang's default). The work of one prefill
  is the same as above; ``vllm:num_requests_waiting`` stays 0.
* **Decode**: the first token is emitted right after prefill; the remaining
  ``max_tokens − 1`` tokens follow at ``decode_s_per_token × slow_factor`` each,
  concurrently with other requests (decode never blocks the prefill queue).

Every service time is divided by ``time_scale`` for the real sleep; everything
reported (metrics, ``/sim/stats``) is in trace seconds (wall × time_scale).

Also served: ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus
text with vLLM metric names), the SGLang worker probes ``/get_model_info``,
``/model_info``, ``/get_server_info``, ``/server_info``, ``/get_loads``,
``/health_generate``, ``/flush_cache`` (model and tokenizer paths are empty, so
``sglang_router`` does not try to download a tokenizer), and the control
endpoints ``POST /sim/reset``, ``POST /sim/restart``, ``POST /sim/faults``,
``GET /sim/stats``. Every response carries ``X-Instance-Id`` (new random id per
process start and per ``/sim/restart``).

Prompt text is never logged: only counts leave the replica.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import secrets
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import click
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from sim.kvcache import BlockCache, block_keys
from tenancy.tokenizer import TokenizerError, WordTokenizer, prompt_text

__all__ = [
    "ReplicaConfig",
    "ReplicaState",
    "Faults",
    "FaultSpecError",
    "RequestError",
    "ParsedRequest",
    "parse_request",
    "parse_faults",
    "create_app",
    "run_app_on",
    "replica_options",
    "config_from_options",
    "quiet_http2_probes",
    "STATE_KEY",
    "MAX_OUTPUT_TOKENS",
]

log = logging.getLogger("sim.replica")

MAX_OUTPUT_TOKENS = 65536
REPLICA_MODELS = ("fifo", "chunked")
DEFAULT_MAX_TOKENS = 16
CLIENT_MAX_SIZE = 16 * 1024 * 1024  # bytes of request body
_FILLER = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit")
# vLLM's TTFT buckets (vllm/engine/metrics.py), in seconds.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_PREFILL_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    20.0, 40.0, 80.0, 160.0, 640.0)

# One tokenizer per process (it keeps no state between calls), the gateway's own: same ids.
_TOKENIZER = WordTokenizer()


@dataclass(frozen=True)
class ReplicaConfig:
    """Static configuration of one simulated replica.

    Units: ``block_size`` in simulator tokens; ``capacity_blocks`` in KV blocks;
    ``token_scale`` real tokens per simulator token (16.0: a 512-token trace
    block is replayed as 32 simulator tokens); ``prefill_tokens_per_s`` in real
    tokens per trace second; ``prefill_overhead_s`` and ``decode_s_per_token``
    in trace seconds; ``time_scale`` divides every sleep (trace s = wall s ×
    time_scale); ``stream_chunk_tokens`` output tokens per SSE event after the
    first token; ``replica_model`` ``fifo`` (one prefill at a time) or
    ``chunked`` (concurrent prefills share the rate; module doc). Raises
    :class:`ValueError` on a non-positive rate or scale or an unknown model.
    """

    replica_id: str = "replica-0"
    model: str = "sim-model"
    block_size: int = 16
    capacity_blocks: int = 4000
    token_scale: float = 16.0
    prefill_tokens_per_s: float = 10000.0
    prefill_overhead_s: float = 0.005
    decode_s_per_token: float = 0.02
    time_scale: float = 1.0
    stream_chunk_tokens: int = 1
    replica_model: str = "fifo"

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError("block_size must be positive")
        if self.capacity_blocks < 0:
            raise ValueError("capacity_blocks must be >= 0")
        for name in ("token_scale", "prefill_tokens_per_s", "time_scale"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        for name in ("prefill_overhead_s", "decode_s_per_token"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.stream_chunk_tokens <= 0:
            raise ValueError("stream_chunk_tokens must be positive")
        if self.replica_model not in REPLICA_MODELS:
            raise ValueError(f"replica_model must be one of {', '.join(REPLICA_MODELS)}")


# --------------------------------------------------------------------------- faults


class FaultSpecError(ValueError):
    """Raised for a malformed ``POST /sim/faults`` body."""


@dataclass(frozen=True)
class Faults:
    """Injected faults; all off by default. Stall durations are WALL seconds (not scaled).

    ``status``: answer inference and health endpoints with this HTTP status and
    an OpenAI error body. ``stall_before_first_byte_s``: wait before queueing
    (no byte is sent meanwhile). ``stall_mid_stream_s``: pause after the first
    SSE event. ``reset_mid_stream``: abort the TCP connection after the first
    SSE event (non-stream: before any byte). ``invalid_json``: bodies/SSE
    payloads that are not JSON. ``broken_sse``: a stream without SSE framing
    and without ``[DONE]``. ``slow_factor``: multiplies prefill and decode
    times (>= 0.01).
    """

    status: int | None = None
    stall_before_first_byte_s: float = 0.0
    stall_mid_stream_s: float = 0.0
    reset_mid_stream: bool = False
    invalid_json: bool = False
    broken_sse: bool = False
    slow_factor: float = 1.0

    def to_json(self) -> dict[str, Any]:
        """Return the active faults as a JSON-able dict (defaults omitted)."""
        default = Faults()
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(default, f.name)}


def parse_faults(body: Any) -> Faults:
    """Build :class:`Faults` from a JSON object; ``{}`` clears all faults.

    Raises :class:`FaultSpecError` for a non-object, an unknown key or a value
    of the wrong type/range.
    """
    if not isinstance(body, dict):
        raise FaultSpecError("faults body must be a JSON object")
    known = {f.name for f in dataclasses.fields(Faults)}
    unknown = set(body) - known
    if unknown:
        raise FaultSpecError(f"unknown fault keys: {sorted(unknown)}")
    kw: dict[str, Any] = {}
    if "status" in body:
        st = body["status"]
        if not (isinstance(st, int) and not isinstance(st, bool) and 400 <= st <= 599):
            raise FaultSpecError("status must be an integer 400..599")
        kw["status"] = st
    for name in ("stall_before_first_byte_s", "stall_mid_stream_s"):
        if name in body:
            v = body[name]
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 3600):
                raise FaultSpecError(f"{name} must be a number of seconds 0..3600")
            kw[name] = float(v)
    for name in ("reset_mid_stream", "invalid_json", "broken_sse"):
        if name in body:
            if not isinstance(body[name], bool):
                raise FaultSpecError(f"{name} must be a boolean")
            kw[name] = body[name]
    if "slow_factor" in body:
        v = body["slow_factor"]
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0.01 <= v <= 1e6):
            raise FaultSpecError("slow_factor must be a number >= 0.01")
        kw["slow_factor"] = float(v)
    return Faults(**kw)


# --------------------------------------------------------------------------- request parsing


class RequestError(Exception):
    """A request the replica rejects; rendered as OpenAI error JSON with ``status``."""

    def __init__(self, message: str, *, status: int = 400, type_: str = "invalid_request_error",
                 code: str | None = "invalid_request", param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type_
        self.code = code
        self.param = param

    def to_json(self) -> dict[str, Any]:
        """Return ``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ParsedRequest:
    """A validated inference request: endpoint ``"chat"``/``"completions"``, token ids, output length (tokens)."""

    endpoint: str
    model: str
    tokens: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    cache_salt: str | None


def parse_request(endpoint: str, body: Any, default_model: str) -> ParsedRequest:
    """Validate an OpenAI completions/chat body and tokenize its prompt once.

    Uses ``tenancy.tokenizer.prompt_text`` + ``WordTokenizer`` exactly like the
    gateway. Output length is ``max_tokens`` or ``max_completion_tokens``
    (default 16, 1..65536). ``cache_salt`` (vLLM) must be a non-empty string
    when present. Raises :class:`RequestError` (400) for anything malformed or
    an empty prompt.
    """
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    model = body.get("model", default_model)
    if not isinstance(model, str) or not model:
        raise RequestError("'model' must be a non-empty string", param="model")
    if endpoint == "chat":
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise RequestError("'messages' must be a non-empty list", param="messages")
    try:
        text = prompt_text(endpoint, body)
    except TokenizerError as exc:
        raise RequestError(str(exc), param="messages" if endpoint == "chat" else "prompt") from None
    tokens = _TOKENIZER.encode(text)
    if not tokens:
        raise RequestError("prompt must contain at least one token", param="prompt")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= MAX_OUTPUT_TOKENS:
        raise RequestError(f"'max_tokens' must be an integer 1..{MAX_OUTPUT_TOKENS}", param="max_tokens")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise RequestError("'stream' must be a boolean", param="stream")
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise RequestError("'stream_options' must be an object", param="stream_options")
        iu = opts.get("include_usage", False)
        if not isinstance(iu, bool):
            raise RequestError("'stream_options.include_usage' must be a boolean", param="stream_options")
        include_usage = iu
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise RequestError("'cache_salt' must be a non-empty string", param="cache_salt")
    return ParsedRequest(endpoint, model, tokens, max_tokens, stream, include_usage, salt)


# --------------------------------------------------------------------------- state and metrics


@dataclass
class ReplicaCounters:
    """Cumulative counters since start or the last ``/sim/reset`` (times in trace seconds)."""

    requests: int = 0
    completed: int = 0
    errors: int = 0
    faulted: int = 0
    cancellations: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generation_tokens: int = 0
    prefills: int = 0
    prefill_busy_s: float = 0.0
    queue_wait_s: float = 0.0


class _Metrics:
    """Per-app Prometheus registry: live gauges/counters from state plus two histograms."""

    def __init__(self, state: ReplicaState) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        labels = ["model_name"]
        self.ttft = Histogram("vllm:time_to_first_token_seconds",
                              "Time to first token in trace seconds (queue + prefill).",
                              labels, registry=self.registry, buckets=_TTFT_BUCKETS)
        self.prefill = Histogram("vllm:request_prefill_time_seconds",
                                 "Prefill service time in trace seconds.",
                                 labels, registry=self.registry, buckets=_PREFILL_BUCKETS)
        self.queue = Histogram("vllm:request_queue_time_seconds",
                               "Time waiting in the prefill queue, trace seconds.",
                               labels, registry=self.registry, buckets=_TTFT_BUCKETS)
        self.registry.register(_LiveCollector(state))
        m = state.cfg.model
        self.ttft_m = self.ttft.labels(m)
        self.prefill_m = self.prefill.labels(m)
        self.queue_m = self.queue.labels(m)


class _LiveCollector(Collector):
    """Reads gauges and counters from :class:`ReplicaState` at scrape time (no per-request cost)."""

    def __init__(self, state: ReplicaState) -> None:
        self._s = state

    def collect(self) -> Iterator[Any]:
        s = self._s
        c = s.counters
        m = [s.cfg.model]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=["model_name"])
            g.add_metric(m, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            cm = CounterMetricFamily(name, doc, labels=["model_name"])
            cm.add_metric(m, value)
            return cm

        yield gauge("vllm:num_requests_running", "Requests in prefill or decode.", s.running)
        yield gauge("vllm:num_requests_waiting", "Requests waiting in the prefill queue.", s.waiting)
        yield gauge("vllm:kv_cache_usage_perc", "KV cache usage, 0..1.", s.cache.usage)
        yield counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", c.prompt_tokens)
        yield counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", c.cached_tokens)
        yield counter("vllm:prompt_tokens", "Prefilled prompt tokens.", c.prompt_tokens)
        yield counter("vllm:generation_tokens", "Generated tokens.", c.generation_tokens)
        succ = CounterMetricFamily("vllm:request_success", "Finished requests.", labels=["model_name", "finished_reason"])
        succ.add_metric([s.cfg.model, "length"], c.completed)
        yield succ
        yield counter("sim:request_cancellations", "Requests cancelled by client disconnect.", c.cancellations)
        yield counter("sim:prefill_busy_seconds", "Trace seconds the prefill queue was busy.", c.prefill_busy_s)


@dataclass
class PrefillResult:
    """Outcome of one prefill: tokens served from cache, service and queue time (trace seconds)."""

    cached_tokens: int
    prefill_s: float
    queue_s: float


class SharedPrefill:
    """Processor sharing of one replica's prefill rate (``replica_model="chunked"``).

    Each :meth:`run` holds ``work_s`` trace seconds of work at the full rate;
    with n runs in progress each advances at 1/n. Times are loop seconds ×
    ``time_scale`` = trace seconds. Owned by one event loop.
    """

    def __init__(self, time_scale: float) -> None:
        self.time_scale = time_scale
        self._active: dict[int, list[Any]] = {}  # id -> [remaining trace s, future]
        self._t_last = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._next_id = 0

    def __len__(self) -> int:
        return len(self._active)

    def _advance(self, now: float) -> None:
        if self._active:
            share = (now - self._t_last) * self.time_scale / len(self._active)
            for item in self._active.values():
                item[0] -= share
        self._t_last = now

    def _reschedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if not self._active:
            return
        for k in [k for k, it in self._active.items() if it[0] <= 1e-9]:
            fut = self._active.pop(k)[1]
            if not fut.done():
                fut.set_result(None)
        if self._active:
            rem = min(it[0] for it in self._active.values())
            self._handle = loop.call_at(self._t_last + rem * len(self._active) / self.time_scale, self._tick, loop)

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        self._handle = None
        self._advance(loop.time())
        for it in self._active.values():  # the soonest one is due now (float rounding)
            if it[0] <= 1e-6:
                it[0] = 0.0
        self._reschedule(loop)

    async def run(self, work_s: float) -> None:
        """Prefill ``work_s`` trace seconds of work (at the full rate) while
        sharing the rate with the other runs; a cancelled run leaves at once."""
        loop = asyncio.get_running_loop()
        self._advance(loop.time())
        k = self._next_id
        self._next_id += 1
        fut = loop.create_future()
        self._active[k] = [max(0.0, work_s), fut]
        self._reschedule(loop)
        try:
            await fut
        finally:
            if k in self._active:
                self._advance(loop.time())
                del self._active[k]
                self._reschedule(loop)


class ReplicaState:
    """Mutable state of one replica: cache, FIFO prefill queue, counters, faults, instance id.

    Owned by one event loop. ``prefill()`` is the only place that touches the cache.
    """

    def __init__(self, cfg: ReplicaConfig) -> None:
        self.cfg = cfg
        self.cache = BlockCache(cfg.capacity_blocks)
        self.instance_id = secrets.token_hex(8)
        self.started_at = time.time()
        self.faults = Faults()
        self.counters = ReplicaCounters()
        self.running = 0
        self.waiting = 0
        self._prefill_lock = asyncio.Lock()  # asyncio.Lock is FIFO-fair: the prefill queue
        self._slot_free_at = 0.0  # loop time at which the running prefill is due to end
        self._shared = SharedPrefill(cfg.time_scale)
        self.metrics = _Metrics(self)

    def reset(self) -> None:
        """Clear cache, counters and metrics (keeps instance id and faults)."""
        self.cache.clear()
        self.counters = ReplicaCounters()
        self.metrics = _Metrics(self)

    def restart(self) -> None:
        """Emulate a restarted replica: reset and take a new instance id (faults are kept;
        only ``POST /sim/faults`` changes them)."""
        self.reset()
        self.instance_id = secrets.token_hex(8)
        self.started_at = time.time()

    def prefill_seconds(self, uncached_tokens: int) -> float:
        """Prefill service time in trace seconds for ``uncached_tokens`` simulator tokens."""
        cfg = self.cfg
        return (cfg.prefill_overhead_s + uncached_tokens * cfg.token_scale / cfg.prefill_tokens_per_s) \
            * self.faults.slow_factor

    async def prefill(self, keys: list[bytes], prompt_tokens: int) -> PrefillResult:
        """Queue for the prefill slot, look up the cache at the head, sleep, insert blocks.

        Counts the request as waiting while queued and as running from the
        moment it holds the slot (the caller decrements ``running`` when the
        request ends). If cancelled while prefilling, no blocks are inserted.
        """
        cfg = self.cfg
        loop = asyncio.get_running_loop()
        t_q = loop.time()
        if cfg.replica_model == "chunked":
            return await self._prefill_shared(keys, prompt_tokens, t_q)
        self.waiting += 1
        try:
            await self._prefill_lock.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            # Drift-free schedule: a prefill starts when the previous one was due to
            # end, not when the event loop got round to handing over the slot.
            now = loop.time()
            start = max(t_q, min(self._slot_free_at, now))
            queue_s = (start - t_q) * cfg.time_scale
            hit = self.cache.match(keys)
            cached = min(hit * cfg.block_size, prompt_tokens)
            service = self.prefill_seconds(prompt_tokens - cached)
            end = start + service / cfg.time_scale
            self._slot_free_at = end
            await asyncio.sleep(end - loop.time())
            self.cache.insert(keys)
        except BaseException:
            self._slot_free_at = loop.time()
            self.running -= 1
            raise
        finally:
            self._prefill_lock.release()
        c = self.counters
        c.prefills += 1
        c.prefill_busy_s += service
        c.queue_wait_s += queue_s
        c.prompt_tokens += prompt_tokens
        c.cached_tokens += cached
        self.metrics.prefill_m.observe(service)
        self.metrics.queue_m.observe(queue_s)
        return PrefillResult(cached, service, queue_s)

    async def _prefill_shared(self, keys: list[bytes], prompt_tokens: int, t_q: float) -> PrefillResult:
        cfg = self.cfg
        loop = asyncio.get_running_loop()
        self.running += 1
        try:
            hit = self.cache.match(keys)
            cached = min(hit * cfg.block_size, prompt_tokens)
            service = self.prefill_seconds(prompt_tokens - cached)
            await self._shared.run(service)
            self.cache.insert(keys)
        except BaseException:
            self.running -= 1
            raise
        elapsed = (loop.time() - t_q) * cfg.time_scale
        queue_s = max(0.0, elapsed - service)  # the slowdown from sharing, reported as queueing
        c = self.counters
        c.prefills += 1
        c.prefill_busy_s += service
        c.queue_wait_s += queue_s
        c.prompt_tokens += prompt_tokens
        c.cached_tokens += cached
        self.metrics.prefill_m.observe(service)
        self.metrics.queue_m.observe(queue_s)
        return PrefillResult(cached, service, queue_s)

    def stats_json(self) -> dict[str, Any]:
        """Return the ``GET /sim/stats`` document (times in trace seconds)."""
        cs = self.cache.stats
        return {
            "replica_id": self.cfg.replica_id,
            "instance_id": self.instance_id,
            **dataclasses.asdict(self.counters),
            "running": self.running,
            "waiting": self.waiting,
            "cache": {
                "blocks": len(self.cache),
                "capacity_blocks": self.cache.capacity_blocks,
                "usage": self.cache.usage,
                "lookups": cs.lookups,
                "queried_blocks": cs.queried_blocks,
                "hit_blocks": cs.hit_blocks,
                "inserted_blocks": cs.inserted_blocks,
                "evicted_blocks": cs.evicted_blocks,
            },
            "faults": self.faults.to_json(),
            "config": dataclasses.asdict(self.cfg),
        }


STATE_KEY: web.AppKey[ReplicaState] = web.AppKey("sim_replica_state", ReplicaState)


# --------------------------------------------------------------------------- response shapes


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _filler(start: int, n: int) -> str:
    """Deterministic text of output tokens ``start .. start+n-1`` (one word each)."""
    k = len(_FILLER)
    return "".join(" " + _FILLER[(start + i) % k] for i in range(n))


def _usage(prompt_tokens: int, completion_tokens: int, cached: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached}}


class _Shapes:
    """Builds OpenAI response objects for one request (chat or completions)."""

    def __init__(self, req: ParsedRequest) -> None:
        self.chat = req.endpoint == "chat"
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        self.model = req.model
        self.obj_chunk = "chat.completion.chunk" if self.chat else "text_completion"
        self.with_usage_field = req.stream and req.include_usage

    def full(self, text: str, usage: dict[str, Any]) -> dict[str, Any]:
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                      "logprobs": None, "finish_reason": "length"}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": [choice], "usage": usage}

    def chunk(self, text: str, first: bool, finish: bool) -> str:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                      "finish_reason": "length" if finish else None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length" if finish else None}
        obj: dict[str, Any] = {"id": self.id, "object": self.obj_chunk, "created": self.created,
                               "model": self.model, "choices": [choice]}
        if self.with_usage_field:
            obj["usage"] = None
        return "data: " + _dumps(obj) + "\n\n"

    def usage_chunk(self, usage: dict[str, Any]) -> str:
        obj = {"id": self.id, "object": self.obj_chunk, "created": self.created, "model": self.model,
               "choices": [], "usage": usage}
        return "data: " + _dumps(obj) + "\n\n"


def _error_response(exc: RequestError) -> web.Response:
    return web.json_response(exc.to_json(), status=exc.status)


def _fault_status_response(status: int) -> web.Response:
    err = RequestError(f"injected fault: HTTP {status}", status=status,
                       type_="server_error" if status >= 500 else "invalid_request_error",
                       code="sim_injected_fault")
    return _error_response(err)


# --------------------------------------------------------------------------- handlers


async def _read_json(request: web.Request) -> Any:
    try:
        return await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RequestError("request body is not valid JSON") from None


def _inference_handler(endpoint: str):  # type: ignore[no-untyped-def]
    async def handler(request: web.Request) -> web.StreamResponse:
        state = request.app[STATE_KEY]
        faults = state.faults
        if faults.status is not None:
            state.counters.faulted += 1
            return _fault_status_response(faults.status)
        try:
            req = parse_request(endpoint, await _read_json(request), state.cfg.model)
        except RequestError as exc:
            state.counters.errors += 1
            return _error_response(exc)
        state.counters.requests += 1
        try:
            return await _serve(request, state, req, faults)
        except asyncio.CancelledError:
            state.counters.cancellations += 1
            raise
        except ConnectionResetError:
            state.counters.cancellations += 1
            raise

    return handler


async def _serve(request: web.Request, state: ReplicaState, req: ParsedRequest, faults: Faults) -> web.StreamResponse:
    cfg = state.cfg
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    keys = block_keys(req.tokens, cfg.block_size, req.cache_salt)
    if faults.stall_before_first_byte_s:
        await asyncio.sleep(faults.stall_before_first_byte_s)
    if faults.reset_mid_stream and not req.stream:
        _abort(request)
        raise ConnectionResetError("injected reset before first byte")
    n_prompt = len(req.tokens)
    pre = await state.prefill(keys, n_prompt)
    try:
        ttft = (loop.time() - t0) * cfg.time_scale
        state.metrics.ttft_m.observe(ttft)
        shapes = _Shapes(req)
        n_out = req.max_tokens
        usage = _usage(n_prompt, n_out, pre.cached_tokens)
        dt = cfg.decode_s_per_token * state.faults.slow_factor / cfg.time_scale  # wall s per token
        t_first = loop.time()
        if not req.stream:
            if n_out > 1:
                await asyncio.sleep((n_out - 1) * dt)
            _finish(state, n_out)
            if faults.invalid_json:
                return web.Response(text='{"id": "cmpl-broken", "choices": [', content_type="application/json")
            return web.json_response(shapes.full(_filler(0, n_out).lstrip(), usage))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        if faults.broken_sse:
            await resp.write(b"this is not server-sent events\n" + _filler(0, 4).encode())
            _finish(state, n_out)
            await resp.write_eof()
            return resp
        await resp.write(_event(shapes.chunk(_filler(0, 1), True, n_out == 1), faults))
        if faults.reset_mid_stream:
            _abort(request)
            raise ConnectionResetError("injected reset mid-stream")
        if faults.stall_mid_stream_s:
            await asyncio.sleep(faults.stall_mid_stream_s)
            t_first = loop.time()
        emitted = 1
        step = cfg.stream_chunk_tokens
        while emitted < n_out:
            k = min(step, n_out - emitted)
            delay = t_first + (emitted + k - 1) * dt - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await resp.write(_event(shapes.chunk(_filler(emitted, k), False, emitted + k == n_out), faults))
            emitted += k
        tail = shapes.usage_chunk(usage) if req.include_usage else ""
        await resp.write((_event(tail, faults) if tail else b"") + b"data: [DONE]\n\n")
        _finish(state, n_out)
        await resp.write_eof()
        return resp
    finally:
        state.running -= 1


def _event(sse: str, faults: Faults) -> bytes:
    if faults.invalid_json:
        return b"data: {not json\n\n"
    return sse.encode()


def _finish(state: ReplicaState, n_out: int) -> None:
    state.counters.completed += 1
    state.counters.generation_tokens += n_out


def _abort(request: web.Request) -> None:
    tr = request.transport
    if tr is not None:
        tr.abort()


async def _health(request: web.Request) -> web.Response:
    s = request.app[STATE_KEY]
    if s.faults.status is not None:
        return _fault_status_response(s.faults.status)
    return web.json_response({"status": "ok", "replica_id": s.cfg.replica_id,
                              "instance_id": s.instance_id, "started_at": s.started_at})


async def _models(request: web.Request) -> web.Response:
    s = request.app[STATE_KEY]
    if s.faults.status is not None:
        return _fault_status_response(s.faults.status)
    return web.json_response({"object": "list", "data": [
        {"id": s.cfg.model, "object": "model", "created": int(s.started_at), "owned_by": "prefixgate-sim",
         "root": s.cfg.model, "parent": None}]})


async def _model_info(request: web.Request) -> web.Response:
    # SGLang's /get_model_info; empty paths keep sglang_router from fetching a tokenizer.
    return web.json_response({"model_path": "", "tokenizer_path": "", "is_generation": True})


async def _server_info(request: web.Request) -> web.Response:
    s = request.app[STATE_KEY]
    return web.json_response({"model_path": "", "tokenizer_path": "", "served_model_name": s.cfg.model,
                              "page_size": s.cfg.block_size, "replica_id": s.cfg.replica_id,
                              "max_total_num_tokens": s.cfg.capacity_blocks * s.cfg.block_size,
                              "version": "prefixgate-sim"})


async def _loads(request: web.Request) -> web.Response:
    s = request.app[STATE_KEY]
    return web.json_response({"load": s.running + s.waiting, "running": s.running, "waiting": s.waiting})


async def _flush_cache(request: web.Request) -> web.Response:
    request.app[STATE_KEY].cache.clear()
    return web.json_response({"status": "ok"})


async def _metrics(request: web.Request) -> web.Response:
    s = request.app[STATE_KEY]
    return web.Response(body=generate_latest(s.metrics.registry),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def _sim_reset(request: web.Request) -> web.Response:
    s = request.app[STATE_KEY]
    s.reset()
    return web.json_response({"status": "ok", "instance_id": s.instance_id})


async def _sim_restart(request: web.Request) -> web.Response:
    s = request.app[STATE_KEY]
    s.restart()
    return web.json_response({"status": "ok", "instance_id": s.instance_id})


async def _sim_faults(request: web.Request) -> web.Response:
    s = request.app[STATE_KEY]
    try:
        s.faults = parse_faults(await _read_json(request))
    except (RequestError, FaultSpecError) as exc:
        return _error_response(exc if isinstance(exc, RequestError) else RequestError(str(exc)))
    return web.json_response({"status": "ok", "faults": s.faults.to_json()})


async def _sim_stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE_KEY].stats_json())


@web.middleware
async def _json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Render aiohttp's own HTTP errors (404, 405, 413) as OpenAI error JSON."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error_response(RequestError(exc.reason, status=exc.status, code=str(exc.status)))


async def _instance_header(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["X-Instance-Id"] = request.app[STATE_KEY].instance_id


def create_app(cfg: ReplicaConfig) -> web.Application:
    """Return the aiohttp app of one simulated replica; its state is ``app[STATE_KEY]``.

    Serve it with ``handler_cancellation=True`` (as :func:`run_app_on` and
    aiohttp's test server do) so that client disconnects cancel the request
    and remove it from the prefill queue.
    """
    app = web.Application(client_max_size=CLIENT_MAX_SIZE, middlewares=[_json_errors])
    app[STATE_KEY] = ReplicaState(cfg)
    app.on_response_prepare.append(_instance_header)
    r = app.router
    r.add_post("/v1/completions", _inference_handler("completions"))
    r.add_post("/v1/chat/completions", _inference_handler("chat"))
    r.add_get("/v1/models", _models)
    r.add_get("/health", _health)
    r.add_get("/health_generate", _health)
    r.add_get("/metrics", _metrics)
    for p in ("/get_model_info", "/model_info"):
        r.add_get(p, _model_info)
    for p in ("/get_server_info", "/server_info"):
        r.add_get(p, _server_info)
    r.add_get("/get_loads", _loads)
    r.add_post("/flush_cache", _flush_cache)
    r.add_get("/flush_cache", _flush_cache)
    r.add_post("/sim/reset", _sim_reset)
    r.add_post("/sim/restart", _sim_restart)
    r.add_post("/sim/faults", _sim_faults)
    r.add_get("/sim/stats", _sim_stats)
    return app


async def run_app_on(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Start ``app`` on ``host:port`` (0 = any free port); return ``(runner, base_url)``.

    Uses ``handler_cancellation=True`` and no access log. Call
    ``await runner.cleanup()`` to stop. Raises :class:`OSError` if the port is taken.
    """
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    addr = runner.addresses[0]
    h = addr[0]
    if ":" in h:
        h = f"[{h}]"
    return runner, f"http://{h}:{addr[1]}"


# --------------------------------------------------------------------------- CLI


class _DropHttp2Probe(logging.Filter):
    """Drops aiohttp's error log for HTTP/2 prior-knowledge probes ("PRI * HTTP/2.0").

    ``sglang_router`` probes each worker over HTTP/2 (gRPC detection) before
    falling back to HTTP/1.1; aiohttp answers 400 and would log a traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, BadHttpMessage) and "PRI" in str(exc))


def quiet_http2_probes() -> None:
    """Install :class:`_DropHttp2Probe` on the ``aiohttp.server`` logger (idempotent)."""
    lg = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _DropHttp2Probe) for f in lg.filters):
        lg.addFilter(_DropHttp2Probe())


_CFG_OPTIONS: list[tuple[str, type, str]] = [
    ("model", str, "served model name"),
    ("block-size", int, "KV block size in simulator tokens"),
    ("capacity-blocks", int, "KV cache capacity in blocks"),
    ("token-scale", float, "real tokens per simulator token"),
    ("prefill-tokens-per-s", float, "prefill rate in real tokens per trace second"),
    ("prefill-overhead-s", float, "fixed prefill cost per request, trace seconds"),
    ("decode-s-per-token", float, "decode time per output token, trace seconds"),
    ("time-scale", float, "trace seconds per wall second (divides every sleep)"),
    ("stream-chunk-tokens", int, "output tokens per SSE event after the first"),
    ("replica-model", str, "fifo (one prefill at a time) or chunked (concurrent prefills share the rate)"),
]


def replica_options(fn: Any) -> Any:
    """Click decorator adding one ``--<field>`` option per :class:`ReplicaConfig` field (defaults from the dataclass)."""
    defaults = ReplicaConfig()
    for name, typ, help_ in reversed(_CFG_OPTIONS):
        attr = name.replace("-", "_")
        fn = click.option(f"--{name}", attr, type=typ, default=getattr(defaults, attr), show_default=True,
                          help=help_)(fn)
    return fn


def config_from_options(replica_id: str, options: Mapping[str, Any]) -> ReplicaConfig:
    """Build a :class:`ReplicaConfig` from click option values (keys = field names).

    Raises :class:`click.UsageError` for an invalid value (click prints it and exits 2).
    """
    fields = {f.name for f in dataclasses.fields(ReplicaConfig)}
    try:
        return ReplicaConfig(replica_id=replica_id, **{k: v for k, v in options.items() if k in fields})
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8000, show_default=True, help="0 = any free port")
@click.option("--replica-id", default="replica-0", show_default=True)
@replica_options
def main(host: str, port: int, replica_id: str, **options: Any) -> None:
    """Run one simulated replica until interrupted."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    quiet_http2_probes()
    cfg = config_from_options(replica_id, options)
    web.run_app(create_app(cfg), host=host, port=port, handler_cancellation=True, access_log=None,
                print=lambda msg: log.info("%s", msg))


if __name__ == "__main__":
    main()
