"""Remote OPA decision point over OPA's REST Data API (opa-python-client).

One ``POST /v1/data/prefixgate/authz/decision?strict-builtin-errors=true``
per decision through :class:`opa_client.AsyncOpaClient`, with:

- no retries (the client's default retries with backoff for seconds);
- one overall deadline per decision (``asyncio.timeout(timeout_s)``), also
  the aiohttp total timeout; any miss raises :class:`PolicyUnavailableError`;
- one aiohttp session with keep-alive (connection reuse), opened by
  :meth:`RemoteOpa.start` and closed by :meth:`RemoteOpa.close`;
- a second, small session for policy and data pushes (:attr:`RemoteOpa.client`,
  ``policy.store.RemoteOpaTarget``) built the same way (same TLS context), with
  its own total deadline ``push_timeout_s``: OPA compiles every module on a
  policy PUT, which may take longer than one decision's deadline (S19-R9);
- TLS configured explicitly: ``https`` verifies against ``ca_file`` (or the
  system store) with hostname checking; ``http`` only to loopback unless
  ``allow_plaintext=True``;
- ``decision_id`` from OPA's response (present when OPA's decision logging
  is on), else a generated uuid4; a 200 without ``result`` is a deny.

If OPA reports bundle revisions (``provenance``), a change of revision calls
the change listeners (a DecisionCache clears itself).

Health (for the gateway's ``/readyz``): :meth:`RemoteOpa.health` answers
from a short-lived cache (``health_interval_s``): a successful decision
counts as a healthy observation; a failed one (unreachable, non-2xx,
deadline) drops the cached state so the next readiness call probes OPA's
``GET /health`` within ``health_timeout_s`` (on the decision session, with
that per-request deadline: S19-FP1). Concurrent callers share one probe.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import ssl
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from opa_client import AsyncOpaClient

from policy.decision import (
    Decision,
    PolicyError,
    PolicyOutputError,
    PolicyUnavailableError,
    decision_from_result,
)

DEFAULT_DECISION_PATH = "prefixgate/authz/decision"
#: pooled connections of the push session: pushes are serialized by the store's lock (one in flight,
#: a give-back beside it at most)
_PUSH_POOL_SIZE = 2


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _OpaClient(AsyncOpaClient):
    """AsyncOpaClient with an explicit TLS context and a pooled connector."""

    def __init__(self, *, ssl_context: ssl.SSLContext | None, pool_size: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._ssl_context = ssl_context
        self._pool_size = pool_size

    async def _init_session(self) -> None:
        self._connector = aiohttp.TCPConnector(
            ssl=self._ssl_context if self._ssl_context is not None else False,
            limit=self._pool_size,
            keepalive_timeout=30,
        )
        self._session = self.http = aiohttp.ClientSession(  # ``http``: ours, for :meth:`health_ok`
            headers=self.headers,
            connector=self._connector,
            timeout=aiohttp.ClientTimeout(total=self.timeout),
        )

    async def health_ok(self, timeout_s: float) -> bool:
        """Whether OPA's ``GET /health`` answers 200 within ``timeout_s`` seconds, on this client's session: the
        request's own ``timeout`` (aiohttp's per-request argument) replaces the session's total, which for the
        decision client is one decision's deadline (session 20, S19-FP1: the probe was cut at ``timeout_s``).

        Raises:
            TimeoutError: no answer within ``timeout_s``. aiohttp.ClientError, OSError: unreachable.
        """
        async with self.http.get(f"{self.schema}{self.host}:{self.port}/health",
                                 timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            return response.status == 200


class RemoteOpa:
    """Decision point backed by a remote OPA server.

    Args:
        url: OPA base URL, ``https://opa.internal:8181`` (no path).
        token: bearer token for OPA's ``--authentication=token``.
        ca_file: PEM trust anchors for the OPA server certificate.
        client_cert: ``(cert_file, key_file)`` for mTLS to OPA.
        timeout_s: overall deadline of one decision, seconds.
        push_timeout_s: total deadline of one policy or data push (PUT or
            DELETE through :attr:`client`), seconds, > 0; past it the push
            is a lost reply (``PolicyTargetError``, S19-R9).
        decision_path: Data API path of the decision document.
        strict_builtin_errors: send ``strict-builtin-errors=true``.
        provenance: ask for ``provenance`` to detect bundle revision changes.
        allow_plaintext: permit ``http`` to a non-loopback host.
        pool_size: max pooled connections.
        health_interval_s: how long a health observation is reused (s).
        health_timeout_s: deadline of one ``GET /health`` probe (s).

    Raises:
        ValueError: bad URL, plaintext to a remote host, or a deadline <= 0.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        ca_file: str | None = None,
        client_cert: tuple[str, str] | None = None,
        timeout_s: float = 0.05,
        push_timeout_s: float = 30.0,
        decision_path: str = DEFAULT_DECISION_PATH,
        strict_builtin_errors: bool = True,
        provenance: bool = False,
        allow_plaintext: bool = False,
        pool_size: int = 32,
        health_interval_s: float = 1.0,
        health_timeout_s: float = 1.0,
    ) -> None:
        if not push_timeout_s > 0:
            raise ValueError(f"push_timeout_s must be > 0, got {push_timeout_s!r}")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
            raise ValueError(f"OPA url must be http(s)://host[:port], got {url!r}")
        tls = parts.scheme == "https"
        if not tls and not allow_plaintext and not _is_loopback(parts.hostname):
            raise ValueError("plaintext http to a non-loopback OPA needs allow_plaintext=True")
        ssl_context = None
        if tls:
            from audit.tls import client_context  # S19-R3: the TLS 1.2 floor and forward-secret suites

            ssl_context = client_context(ca_file, certfile=client_cert[0] if client_cert else None,
                                         keyfile=client_cert[1] if client_cert else None)
        common: dict[str, Any] = dict(ssl_context=ssl_context, host=parts.hostname,
                                      port=parts.port or (443 if tls else 8181), ssl=tls, token=token, retries=0)
        self._client = _OpaClient(pool_size=pool_size, timeout=timeout_s, **common)  # decisions, health
        self._push_client = _OpaClient(pool_size=_PUSH_POOL_SIZE, timeout=push_timeout_s, **common)  # S19-R9
        self._timeout_s = timeout_s
        self._path = decision_path.strip("/")
        params: dict[str, str] = {}
        if strict_builtin_errors:
            params["strict-builtin-errors"] = "true"
        if provenance:
            params["provenance"] = "true"
        self._params = params
        self._listeners: list[Callable[[], None]] = []
        self._revision: str | None = None
        self._started = False
        self._health_interval_s = health_interval_s
        self._health_timeout_s = health_timeout_s
        self._health: tuple[bool, str, float] | None = None  # (ok, reason, monotonic time)
        self._probe: asyncio.Task[tuple[bool, str]] | None = None

    @property
    def client(self) -> AsyncOpaClient:
        """The started client for policy and data management calls (pushes).

        Its total deadline per request is ``push_timeout_s``, not the
        decision deadline ``timeout_s`` (S19-R9); decisions use a session of
        their own, so a push never holds a decision's connection.
        """
        return self._push_client

    async def start(self) -> None:
        """Open the HTTP sessions, decisions and pushes (idempotent)."""
        if not self._started:
            await self._client.__aenter__()
            try:
                await self._push_client.__aenter__()
            except BaseException:
                await self._client.close_connection()
                raise
            self._started = True

    async def close(self) -> None:
        """Close the HTTP session (and any health probe in flight)."""
        if self._probe is not None and not self._probe.done():
            self._probe.cancel()
        self._probe, self._health = None, None
        if self._started:
            self._started = False
            try:
                await self._client.close_connection()
            finally:
                await self._push_client.close_connection()

    async def __aenter__(self) -> RemoteOpa:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def health(self) -> tuple[bool, str]:
        """``(ok, reason)`` of the decision point, for readiness.

        Reuses an observation younger than ``health_interval_s`` (a decision
        or a probe); otherwise probes ``GET /health`` within
        ``health_timeout_s``. ``reason`` is empty when ok. Never raises.
        """
        if not self._started:
            return False, "remote OPA client not started"
        now = asyncio.get_running_loop().time()
        cached = self._health
        if cached is not None and now - cached[2] < self._health_interval_s:
            return cached[0], cached[1]
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(self._run_probe())
        return await asyncio.shield(self._probe)

    async def _run_probe(self) -> tuple[bool, str]:
        try:
            async with asyncio.timeout(self._health_timeout_s):  # its own deadline, not a decision's (S19-FP1)
                ok = await self._client.health_ok(self._health_timeout_s)
            reason = "" if ok else "OPA health check failed"
        except TimeoutError:
            ok, reason = False, f"OPA health check exceeded {self._health_timeout_s}s"
        except Exception as exc:  # unreachable (aiohttp.ClientError, OSError), or anything else: not ready
            ok, reason = False, f"OPA health check failed: {type(exc).__name__}"
        self._health = (ok, reason, asyncio.get_running_loop().time())
        return ok, reason

    def _observed(self, ok: bool) -> None:
        if ok:
            self._health = (True, "", asyncio.get_running_loop().time())
        else:
            self._health = None  # the next readiness call probes

    def add_change_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` when OPA's reported policy revision changes."""
        self._listeners.append(callback)

    def notify_change(self) -> None:
        """Tell listeners that policy or data changed (used by the store)."""
        for callback in self._listeners:
            callback()

    def _observe_revision(self, body: dict[str, Any]) -> None:
        prov = body.get("provenance")
        if not isinstance(prov, dict):
            return
        rev = json.dumps([prov.get("revision"), prov.get("bundles")], sort_keys=True)
        if self._revision is not None and rev != self._revision:
            self.notify_change()
        self._revision = rev

    async def decide(self, input: dict[str, Any]) -> Decision:
        """Ask OPA for one decision within ``timeout_s``.

        Raises:
            PolicyUnavailableError: not started, unreachable, non-2xx, or
                past the deadline.
            PolicyOutputError: response or decision of the wrong shape.
        """
        if not self._started:
            raise PolicyUnavailableError("RemoteOpa.start() was not called")
        try:
            async with asyncio.timeout(self._timeout_s):
                body = await self._client.query_rule(input, self._path, query_params=self._params)
        except TimeoutError:
            self._observed(False)
            raise PolicyUnavailableError(f"OPA decision deadline of {self._timeout_s}s exceeded") from None
        except aiohttp.ClientResponseError as exc:
            self._observed(False)
            raise PolicyUnavailableError(f"OPA answered HTTP {exc.status}") from None
        except (aiohttp.ClientError, OSError) as exc:
            self._observed(False)
            raise PolicyUnavailableError(f"OPA unreachable: {type(exc).__name__}") from None
        except ValueError:
            raise PolicyOutputError("OPA response is not JSON") from None
        self._observed(True)
        if not isinstance(body, dict):
            raise PolicyOutputError("OPA response is not an object")
        self._observe_revision(body)
        decision_id = body.get("decision_id")
        if not isinstance(decision_id, str) or not decision_id:
            decision_id = str(uuid.uuid4())
        return decision_from_result(body.get("result"), decision_id)


__all__ = ["RemoteOpa", "PolicyError"]
