"""What a stream whose client left is charged: what the replica sent, not what the client took (review R8-3).

Before session 8 a streamed answer ended by its client (disconnect, or a client-side bound of
gateway/write_stall.py) was settled on the output *relayed* to the client (ledger basis ``relayed``),
and the client decides how much is relayed: one that stopped reading a 4096-token stream and closed
after the engine had finished was charged 1,144 output tokens (the rest of the answer, usage chunk
included, sat in the gateway's upstream buffer). So when the client leaves first,
:func:`settle_client_end`:

1. feeds what the gateway has already received from the replica and not relayed
   (:meth:`gateway.upstream_response.UpstreamResponse.take_buffered`, decoded as the stream was) through
   the stream's own :class:`gateway.sse.SseScanner`, without waiting (the request is being cancelled:
   nothing is awaited), so a usage chunk already received settles the request on the replica's own
   count (basis ``usage``) and otherwise the output counted is what was *received from the replica*
   (>= what was relayed: basis ``relayed``, ``max(relayed, received)``);
2. when that count cannot be the engine's (the usage was not received, the answer is not complete,
   and the gateway had stopped reading the replica because the client did not take the bytes: more
   than :data:`gateway.upstream_conn.HIGH_WATER` bytes were waiting), the true count is unknown and
   the client chose how much of it the gateway saw: the request is charged its whole reservation
   (``progress`` ``unknown``, basis ``reservation``), never what the client happened to take.

A client that leaves a stream it was reading at full speed (a user's "stop") leaves little or nothing
buffered: it is charged the output the replica had sent when it left. Cost: one scan of at most
``HIGH_WATER`` plus one socket read of bytes, only on a client-side end.
"""

from __future__ import annotations

from gateway.proxy import UpstreamStream
from gateway.sse import SseScanner
from gateway.upstream_conn import HIGH_WATER

__all__ = ["settle_client_end"]


def settle_client_end(up: UpstreamStream | None, scanner: SseScanner) -> bool:
    """Scan what was received from the replica and not relayed when the client left; returns False when
    the output count cannot be known (the replica was held back by the client: charge the reservation).

    ``up``: the open upstream stream (None: nothing more to read); ``scanner``: the stream's scanner,
    fed the received bytes here (its ``usage`` and ``output_tokens`` then describe what the replica
    sent). Never waits, never raises (a broken tail keeps what was counted before it).
    """
    if up is None or scanner.done:
        return True
    raw = b""
    try:
        raw = up.response.take_buffered()
        data = up.decoder.feed(raw) if raw else b""
        if up.response.complete:
            data += up.decoder.finish()
        if data:
            scanner.feed(data)
    except Exception:  # a broken or undecodable tail: the count so far stands
        return scanner.usage is not None or not raw or len(raw) <= HIGH_WATER
    return scanner.usage is not None or scanner.done or up.response.complete or len(raw) <= HIGH_WATER
