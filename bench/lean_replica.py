"""A lean stand-in for the simulated replicas in CPU benchmarks of the gateway (issue 16; not a test).

``python -m bench.lean_replica [--replicas 2] [--host 127.0.0.1] [--model sim-model] [--ready-file PATH]``

Why: on a 2-core machine the load generator, Redis, the audit worker and
the replicas share the cores with the gateway, and every core-second they
take is one the gateway cannot have. The simulated replicas
(``python -m sim.cluster``: aiohttp, a KV-cache model with prefill queueing,
Prometheus histograms) cost about 230 µs of CPU per request in
``bench.workers_peak`` (session 6), a third of what the gateway itself
spends. This replica answers the same OpenAI shapes with as little CPU as
an asyncio ``Protocol`` and ``httptools`` allow, so a bench can report the
gateway's scaling with less of the machine taken by the fixture. It is a
bench fixture only: it models no cache, no queue and no decode time, and a
bench using it says so beside its figures.

Served, on each of ``--replicas`` loopback ports (one process, one event
loop; every response carries ``X-Instance-Id``, a random id per start):

- ``POST /v1/completions`` and ``POST /v1/chat/completions``: the prompt
  tokenized as the simulated replica does (``tenancy.tokenizer.prompt_text``
  and ``WordTokenizer``, so ``usage.prompt_tokens`` is the same number),
  ``max_tokens`` (or ``max_completion_tokens``, default 16) output words
  at once; ``usage.prompt_tokens_details.cached_tokens`` is always 0. With
  ``"stream": true`` an SSE stream of one ``text_completion`` /
  ``chat.completion.chunk`` event per token, a usage event when
  ``stream_options.include_usage`` is true, then ``data: [DONE]``. A body
  that is not a JSON object with a prompt: 400 with an OpenAI error object.
- ``GET /health`` (``{"status": "ok", "replica_id", "instance_id", "started_at"}``),
  ``GET /v1/models`` and ``GET /metrics`` (the vLLM gauges
  ``num_requests_running`` / ``num_requests_waiting`` at 0 and the counters
  ``request_success`` and ``generation_tokens``); anything else 404.

HTTP/1.1 with keep-alive, ``Content-Length`` bodies (no chunked request
bodies: the gateway sends a length). Once every port listens, writes the
JSON list ``[{"replica_id", "url"}]`` (as ``sim.cluster``) to
``--ready-file`` (atomically) and to stdout, then serves until SIGTERM or
SIGINT. Runs on ``uvloop`` when it is installed (as the gateway does).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import signal
import time
from pathlib import Path
from typing import Any

import httptools
import orjson

from tenancy.tokenizer import TokenizerError, WordTokenizer, prompt_text

__all__ = ["LeanReplica", "main", "serve"]

_TOKENIZER = WordTokenizer()
_WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog")
_ENDPOINTS = {b"/v1/completions": "completions", b"/v1/chat/completions": "chat"}


class LeanReplica:
    """State of one lean replica: ``replica_id``, ``model``, the ``instance_id`` of this start and
    its counters (``completed`` requests, ``generation_tokens``)."""

    def __init__(self, replica_id: str, model: str) -> None:
        self.replica_id = replica_id
        self.model = model
        self.instance_id = secrets.token_hex(8)
        self.started_at = time.time()
        self.completed = 0
        self.generation_tokens = 0
        self.ids = itertools.count()
        self.head_extra = b"X-Instance-Id: " + self.instance_id.encode() + b"\r\n"

    def answer(self, method: bytes, path: bytes, body: bytes) -> list[bytes]:
        """The response to one request, as the bytes to write (status line, headers, body)."""
        path = path.split(b"?", 1)[0]
        endpoint = _ENDPOINTS.get(path)
        if endpoint is not None and method == b"POST":
            return self._inference(endpoint, body)
        if method == b"GET" and path == b"/health":
            return self._json(200, {"status": "ok", "replica_id": self.replica_id,
                                    "instance_id": self.instance_id, "started_at": self.started_at})
        if method == b"GET" and path == b"/v1/models":
            return self._json(200, {"object": "list", "data": [
                {"id": self.model, "object": "model", "created": int(self.started_at), "owned_by": "prefixgate-lean",
                 "root": self.model, "parent": None}]})
        if method == b"GET" and path == b"/metrics":
            m = f'{{model_name="{self.model}"}}'
            text = (f"vllm:num_requests_running{m} 0\nvllm:num_requests_waiting{m} 0\n"
                    f'vllm:request_success_total{{model_name="{self.model}",finished_reason="length"}} {self.completed}\n'
                    f"vllm:generation_tokens_total{m} {self.generation_tokens}\n").encode()
            return self._raw(200, b"text/plain; version=0.0.4; charset=utf-8", text)
        return self._json(404, {"error": {"message": "not found", "type": "not_found", "param": None, "code": 404}})

    def _raw(self, status: int, ctype: bytes, body: bytes) -> list[bytes]:
        reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found"}.get(status, b"Error")
        return [b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n"
                % (status, reason, ctype, len(body), self.head_extra), body]

    def _json(self, status: int, doc: Any) -> list[bytes]:
        return self._raw(status, b"application/json", orjson.dumps(doc))

    def _error(self, message: str) -> list[bytes]:
        return self._json(400, {"error": {"message": message, "type": "invalid_request_error", "param": None,
                                          "code": None}})

    def _inference(self, endpoint: str, body: bytes) -> list[bytes]:
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            return self._error("request body is not valid JSON")
        if not isinstance(doc, dict):
            return self._error("request body must be a JSON object")
        try:
            n_prompt = len(_TOKENIZER.encode(prompt_text(endpoint, doc)))
        except (TokenizerError, TypeError, ValueError) as exc:
            return self._error(str(exc))
        n_out = doc.get("max_completion_tokens", doc.get("max_tokens")) or 16
        if not isinstance(n_out, int) or not 1 <= n_out <= 65536:
            return self._error("'max_tokens' must be an integer 1..65536")
        self.completed += 1
        self.generation_tokens += n_out
        usage = {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out,
                 "prompt_tokens_details": {"cached_tokens": 0}}
        chat = endpoint == "chat"
        rid = ("chatcmpl-" if chat else "cmpl-") + f"{self.instance_id}{next(self.ids):x}"
        created, model = int(time.time()), doc.get("model") or self.model
        words = [_WORDS[i % len(_WORDS)] for i in range(n_out)]
        if not doc.get("stream"):
            text = " ".join(words)
            choice: dict[str, Any] = ({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                                       "finish_reason": "length"} if chat else
                                      {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"})
            return self._json(200, {"id": rid, "object": "chat.completion" if chat else "text_completion",
                                    "created": created, "model": model, "choices": [choice], "usage": usage})
        opts = doc.get("stream_options")
        with_usage = isinstance(opts, dict) and opts.get("include_usage") is True
        obj = "chat.completion.chunk" if chat else "text_completion"
        events = []
        for i, w in enumerate(words):
            last = i == n_out - 1
            text = (" " if i else "") + w
            c: dict[str, Any] = ({"index": 0, "delta": {"role": "assistant", "content": text} if i == 0 else
                                  {"content": text}, "logprobs": None, "finish_reason": "length" if last else None}
                                 if chat else {"index": 0, "text": text, "logprobs": None,
                                               "finish_reason": "length" if last else None})
            ev: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": model, "choices": [c]}
            if with_usage:
                ev["usage"] = None
            events.append(b"data: " + orjson.dumps(ev) + b"\n\n")
        if with_usage:
            events.append(b"data: " + orjson.dumps({"id": rid, "object": obj, "created": created, "model": model,
                                                    "choices": [], "usage": usage}) + b"\n\n")
        events.append(b"data: [DONE]\n\n")
        return self._raw(200, b"text/event-stream\r\nCache-Control: no-cache", b"".join(events))


class _Conn(asyncio.Protocol):
    """One client connection: httptools parses, each complete request is answered in order."""

    def __init__(self, replica: LeanReplica) -> None:
        self.replica = replica
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Any = None
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        out = self.replica.answer(self.parser.get_method(), self.url, b"".join(self.body))
        self.transport.writelines(out)
        if not self.parser.should_keep_alive():
            self.transport.close()


async def serve(replicas: int, host: str = "127.0.0.1", model: str = "sim-model",
                ready_file: Path | None = None) -> None:
    """Serve ``replicas`` lean replicas on free ports of ``host`` until cancelled or SIGTERM/SIGINT;
    writes the ready document (module doc) once all listen."""
    loop = asyncio.get_running_loop()
    servers, doc = [], []
    for i in range(replicas):
        rep = LeanReplica(f"replica-{i}", model)
        server = await loop.create_server(lambda rep=rep: _Conn(rep), host, 0)
        servers.append(server)
        doc.append({"replica_id": rep.replica_id, "url": f"http://{host}:{server.sockets[0].getsockname()[1]}"})
    text = orjson.dumps(doc).decode()
    if ready_file is not None:
        tmp = ready_file.with_name(ready_file.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, ready_file)
    print(text, flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for s in servers:
            s.close()


def main() -> None:
    """``python -m bench.lean_replica``: see the module doc."""
    from sim.click_options import ClickOptions

    ap = ClickOptions(prog="python -m bench.lean_replica", description=__doc__.splitlines()[0])
    ap.option("--replicas", type=int, default=2)
    ap.option("--host", default="127.0.0.1")
    ap.option("--model", default="sim-model")
    ap.option("--ready-file", default=None)
    a = ap.parse()
    coro = serve(a.replicas, a.host, a.model, Path(a.ready_file) if a.ready_file else None)
    try:
        import uvloop  # the gateway's own loop (uvicorn's); less CPU per wake-up than asyncio's
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)


if __name__ == "__main__":
    main()
