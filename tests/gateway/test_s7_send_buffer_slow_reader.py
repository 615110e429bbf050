"""Review R7b-4, end to end: with ``server.client_send_buffer_bytes`` bounding the accepted socket,
a client that reads NOTHING of a ~600 kB streamed answer is seen by
``limits.client_min_read_bytes_per_s`` and its stream is ended (499 ``client_read_too_slow``).
Before, the kernel's autotuned send buffer (up to tcp_wmem max, 4 MiB) took the whole answer and
the stream completed as 200 with every token "relayed" to a client that got none of it."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.app import build_public_app
from gateway.server import uvicorn_config
from tests.gateway.test_s7_slow_reader import FAST_REPLICA, MAX_TOKENS, SLOW, _request_id, ask_for_stream
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures
from tests.support.listeners import serving
from tests.support.waiting import wait_for


@pytest.fixture
def n_replicas() -> int:
    return 1


@pytest.mark.parametrize(("config_overrides", "replica_cfg"), [(SLOW, FAST_REPLICA)])
async def test_a_client_reading_nothing_is_ended_under_a_bounded_send_buffer(stack: Any, audit_log: ListLog) -> None:  # noqa: F811
    c = stack.components
    async with serving() as serve:
        host, port = await serve(uvicorn_config(build_public_app(c, manage_lifecycle=False), "127.0.0.1", 0,
                                                limits=c.config.limits, client_send_buffer_bytes=16384))
        sock, head = await ask_for_stream(host, port, stack.auth()["Authorization"])
        try:
            rid = _request_id(head)
            # the client now reads nothing at all
            events = await wait_for(lambda: [e for e in audit_log.events if getattr(e, "request_id", None) == rid],
                                    timeout_s=60, what="the stream's audit event")
        finally:
            sock.close()
    assert events[0].status_code == 499, (events[0].status_code, events[0].error_code)  # before: 200
    assert events[0].error_code in ("client_read_too_slow", "client_write_stall")
    # R8-3 (session 8): no longer "< MAX_TOKENS": the replica's output received but not relayed is
    # charged too (here usually the whole answer with its usage chunk: basis usage, MAX_TOKENS)
    charged = c.ledger.totals()["tenant-a"].charged["output"]
    assert events[0].ledger.output_relayed <= charged <= MAX_TOKENS
    assert events[0].ledger.basis != "usage" or charged == MAX_TOKENS
