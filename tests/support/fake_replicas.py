"""Fake replicas (aiohttp) for the breaker tests on an in-process stack (``tests/conftest.py`` ``stack``):
review R7-2's query of death and R7b-1's per-tenant attribution.

A test module defines its fake's switches (a dataclass with ``url`` and ``healthy``) and an app
factory that gives :func:`base_app` its ``/v1/completions`` handler; its ``fakes`` fixture calls
:func:`serving` with them. Import :func:`n_replicas` (the simulated cluster is not used) into the
module; :func:`completion` is a completion body for the fake model.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import pytest
from aiohttp import web

from sim.procs import free_port

__all__ = ["PLAIN_ANSWER", "FakeSwitches", "PlainFake", "base_app", "completion", "n_replicas", "replicas_of",
           "serving"]


class FakeSwitches(Protocol):
    """What every fake replica has: its ``url`` (set once it listens) and ``/health``'s answer."""

    url: str
    healthy: bool


F = TypeVar("F", bound=FakeSwitches)


@dataclass
class PlainFake:
    """A fake replica with no switch of its own: its ``url`` and ``/health``'s answer (session 16: was a
    copy in each test module whose fake only answers fixed shapes)."""

    url: str = ""
    healthy: bool = True


def replicas_of(fakes: list[Any], **sections: Any) -> dict[str, Any]:
    """``config_overrides`` pointing the stack at ``fakes`` (replica ``f{i}`` = ``fakes[i]``, pool ``default``),
    plus ``sections`` (more configuration sections, e.g. ``limits={...}``)."""
    return {"replicas": [{"id": f"f{i}", "url": f.url, "pool": "default"} for i, f in enumerate(fakes)], **sections}


#: a fake replica's plain (non-streamed) completion answer
PLAIN_ANSWER: dict[str, Any] = {"id": "c", "object": "text_completion", "created": 0, "model": "sim-model",
                                "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
                                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


def base_app(fake: FakeSwitches, completions: Callable[[web.Request], Awaitable[web.StreamResponse]]
             ) -> web.Application:
    """An app with ``GET /health`` (200 with an instance id while ``fake.healthy``, else 503) and
    ``POST /v1/completions`` answered by ``completions``."""
    async def health(request: web.Request) -> web.Response:
        return web.json_response({"instance_id": "i-" + fake.url[-5:]}, status=200 if fake.healthy else 503)

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/completions", completions)
    return app


@asynccontextmanager
async def serving(fakes: list[F], app: Callable[[F], web.Application]) -> AsyncIterator[list[F]]:
    """Serve each of ``fakes`` (``app(fake)``) on a free local port (``fake.url`` set); stop them at the end."""
    runners = []
    try:
        for fake in fakes:
            runner = web.AppRunner(app(fake))
            await runner.setup()
            runners.append(runner)
            port = free_port()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            fake.url = f"http://127.0.0.1:{port}"
        yield fakes
    finally:
        for runner in runners:
            await runner.cleanup()


@pytest.fixture
def n_replicas() -> int:
    """The stack's simulated cluster is not used by these tests: one replica."""
    return 1


def completion(prompt: str, **kw: Any) -> dict[str, Any]:
    """A completion request body for the fake model (4 tokens at most)."""
    return {"model": "sim-model", "prompt": prompt, "max_tokens": 4, **kw}
