"""Open-loop, time-scaled replay of a Mooncake trace against an OpenAI-compatible endpoint.

Each request is sent at ``timestamp / time_scale`` wall seconds after the
start (arrival times are kept, whatever the server's speed: open loop) as a
streaming ``POST {base_url}/v1/completions`` with
``stream_options.include_usage``. Per request it measures TTFT (first
non-empty content chunk) and end-to-end latency, converted back to trace
seconds (wall x ``time_scale``), and reads the final usage chunk's
``prompt_tokens`` and ``prompt_tokens_details.cached_tokens``. Prompt text is
never logged.

Works against the PrefixGate gateway (``headers_for`` supplies each
tenant's JWT-SVID bearer header), SGLang's router (``salt_for`` sets the
body's ``cache_salt`` so replica caches are partitioned per tenant as
PrefixGate partitions them) or a replica directly.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from sim.trace import TraceRequest, build_prompt, sim_prompt_tokens

__all__ = ["ReplayConfig", "RequestRecord", "ReplayResult", "replay", "HeadersFor", "SaltFor"]

HeadersFor = Callable[[str], Mapping[str, str]]
SaltFor = Callable[[str], "str | None"]


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """Replay settings.

    ``time_scale``: trace seconds per wall second (10 = ten times faster).
    ``max_tokens_cap``: upper bound on ``max_tokens`` (real ``output_length``
    otherwise). ``concurrency``: most requests in flight (a request whose slot
    is late is still sent, and its lateness recorded). ``request_timeout_s`` /
    ``total_timeout_s``: wall seconds. ``seed``: recorded with the result and
    sent as the body's ``seed`` when ``send_seed``.
    """

    base_url: str
    model: str = "sim-model"
    time_scale: float = 1.0
    max_tokens_cap: int | None = None
    concurrency: int = 512
    request_timeout_s: float = 120.0
    total_timeout_s: float = 900.0
    seed: int = 0
    send_seed: bool = False


@dataclass(slots=True)
class RequestRecord:
    """Outcome of one replayed request.

    Times are trace seconds (wall x time_scale): ``scheduled_s`` (arrival),
    ``late_s`` (client-side delay before sending), ``ttft_s``, ``e2e_s``.
    Token counts are simulator tokens as reported by the server's usage
    chunk. ``error`` is ``None`` or a short kind (``http_429``, ``timeout``,
    ``connect``, ``stream``, ``no_usage``, ``cancelled``). ``target``: index
    of the base URL it was sent to (``replay(base_urls=...)``; 0 otherwise).
    """

    index: int
    tenant: str
    scheduled_s: float
    prompt_tokens_sent: int
    late_s: float = 0.0
    ttft_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    status: int | None = None
    error: str | None = None
    target: int = 0


@dataclass(slots=True)
class ReplayResult:
    """All request records of one replay plus its setting; ``wall_s`` is the run's wall time."""

    records: list[RequestRecord]
    time_scale: float
    wall_s: float
    base_url: str
    seed: int
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> list[RequestRecord]:
        """Records that completed without error."""
        return [r for r in self.records if r.error is None]

    def errors_by_kind(self) -> dict[str, int]:
        """Count of failed requests per error kind."""
        return dict(Counter(r.error for r in self.records if r.error is not None))

    def client_hit_rate(self) -> float | None:
        """Token-weighted hit rate from the usage chunks (sum cached / sum prompt), ``None`` if unreported."""
        rows = [r for r in self.ok if r.prompt_tokens and r.cached_tokens is not None]
        total = sum(r.prompt_tokens or 0 for r in rows)
        return sum(r.cached_tokens or 0 for r in rows) / total if total else None

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (records included; they hold no prompt text)."""
        return {
            "time_scale": self.time_scale, "wall_s": self.wall_s, "base_url": self.base_url,
            "seed": self.seed, "meta": self.meta, "records": [asdict(r) for r in self.records],
        }


class _StreamError(Exception):
    """The SSE stream ended badly (malformed event or missing usage)."""


def _body(req: TraceRequest, cfg: ReplayConfig, salt: str | None) -> dict[str, Any]:
    max_tokens = max(1, req.output_length)
    if cfg.max_tokens_cap is not None:
        max_tokens = min(max_tokens, cfg.max_tokens_cap)
    body: dict[str, Any] = {
        "model": cfg.model,
        "prompt": build_prompt(req),
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if salt is not None:
        body["cache_salt"] = salt
    if cfg.send_seed:
        body["seed"] = cfg.seed
    return body


def _apply_usage(rec: RequestRecord, usage: Mapping[str, Any]) -> None:
    rec.prompt_tokens = usage.get("prompt_tokens")
    rec.completion_tokens = usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    rec.cached_tokens = int(cached) if isinstance(cached, int) else 0


async def _read_stream(resp: aiohttp.ClientResponse, rec: RequestRecord, t_send: float, scale: float) -> None:
    """Consume an OpenAI SSE stream: first content chunk sets TTFT, usage chunk sets tokens."""
    saw_usage = False
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        try:
            event = json.loads(data)
        except json.JSONDecodeError as exc:
            raise _StreamError("malformed SSE data") from exc
        if not isinstance(event, dict):
            raise _StreamError("SSE data is not an object")
        if "error" in event:
            raise _StreamError("error event")
        if rec.ttft_s is None:
            for choice in event.get("choices") or []:
                if choice.get("text") or (choice.get("delta") or {}).get("content"):
                    rec.ttft_s = (time.monotonic() - t_send) * scale
                    break
        usage = event.get("usage")
        if isinstance(usage, Mapping):
            _apply_usage(rec, usage)
            saw_usage = True
    if not saw_usage:
        raise _StreamError("no usage chunk")


async def _one(
    session: aiohttp.ClientSession,
    req: TraceRequest,
    tenant: str,
    cfg: ReplayConfig,
    t0: float,
    sem: asyncio.Semaphore,
    headers_for: HeadersFor | None,
    salt_for: SaltFor | None,
    base_url: str,
    target: int = 0,
) -> RequestRecord:
    scale = cfg.time_scale
    rec = RequestRecord(req.index, tenant, req.timestamp, sim_prompt_tokens(req), target=target)
    delay = t0 + req.timestamp / scale - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    body = _body(req, cfg, salt_for(tenant) if salt_for else None)
    headers = dict(headers_for(tenant)) if headers_for else {}
    async with sem:
        t_send = time.monotonic()
        rec.late_s = max(0.0, t_send - (t0 + req.timestamp / scale)) * scale
        try:
            async with session.post(
                f"{base_url.rstrip('/')}/v1/completions", json=body, headers=headers,
                timeout=aiohttp.ClientTimeout(total=cfg.request_timeout_s),
            ) as resp:
                rec.status = resp.status
                if resp.status != 200:
                    await resp.read()
                    rec.error = f"http_{resp.status}"
                    return rec
                await _read_stream(resp, rec, t_send, scale)
                rec.e2e_s = (time.monotonic() - t_send) * scale
                if rec.ttft_s is None:  # zero-content answer: first byte of the end counts
                    rec.ttft_s = rec.e2e_s
        except asyncio.TimeoutError:
            rec.error = "timeout"
        except aiohttp.ClientConnectorError:
            rec.error = "connect"
        except (_StreamError, aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError):
            rec.error = "stream"
        except aiohttp.ClientError:
            rec.error = "client"
    return rec


async def replay(
    reqs: Sequence[TraceRequest],
    cfg: ReplayConfig,
    tenants: Sequence[str] | None = None,
    *,
    headers_for: HeadersFor | None = None,
    salt_for: SaltFor | None = None,
    base_urls: Sequence[str] | None = None,
) -> ReplayResult:
    """Replay ``reqs`` open-loop against ``cfg.base_url`` and return every request's record.

    ``base_urls``: several gateway instances behind a round-robin client:
    request ``i`` (in trace order) goes to ``base_urls[i % len(base_urls)]``
    (its record's ``target`` is that index); default ``[cfg.base_url]``.

    ``tenants`` is parallel to ``reqs`` (default: all ``"tenant-a"``; see
    :func:`sim.trace.assign_tenants`). Arrival times are relative to the
    first request's timestamp. Requests still running at
    ``cfg.total_timeout_s`` are cancelled and recorded as ``cancelled``.
    Raises :class:`ValueError` for a non-positive time scale or mismatched
    tenants.
    """
    if cfg.time_scale <= 0:
        raise ValueError("time_scale must be positive")
    if tenants is None:
        tenants = ["tenant-a"] * len(reqs)
    if len(tenants) != len(reqs):
        raise ValueError("tenants must be parallel to reqs")
    base_ts = min((r.timestamp for r in reqs), default=0.0)
    shifted = [
        TraceRequest(r.index, r.timestamp - base_ts, r.input_length, r.output_length, r.hash_ids) for r in reqs
    ]
    urls = list(base_urls) if base_urls else [cfg.base_url]
    sem = asyncio.Semaphore(cfg.concurrency)
    conn = aiohttp.TCPConnector(limit=cfg.concurrency, limit_per_host=cfg.concurrency)
    t_start = time.monotonic()
    async with aiohttp.ClientSession(connector=conn) as session:
        t0 = time.monotonic() + 0.05
        tasks = [
            asyncio.create_task(_one(session, r, t, cfg, t0, sem, headers_for, salt_for,
                                     urls[i % len(urls)], i % len(urls)))
            for i, (r, t) in enumerate(zip(shifted, tenants))
        ]
        done, pending = await asyncio.wait(tasks, timeout=cfg.total_timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    records: list[RequestRecord] = []
    for task, r, t in zip(tasks, shifted, tenants):
        if task in done and not task.cancelled() and task.exception() is None:
            records.append(task.result())
        elif task in done and not task.cancelled():
            err = f"internal_{type(task.exception()).__name__}"
            records.append(RequestRecord(r.index, t, r.timestamp, sim_prompt_tokens(r), error=err))
        else:
            records.append(RequestRecord(r.index, t, r.timestamp, sim_prompt_tokens(r), error="cancelled"))
    return ReplayResult(records, cfg.time_scale, time.monotonic() - t_start, cfg.base_url, cfg.seed)
