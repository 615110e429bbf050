"""Session 27 (defer27): bench.timeline's per-round figures from client and gateway stamps (bench code, no server)."""

from __future__ import annotations

import pytest

from bench.timeline import analyse


def _client(c_start: int, c_sent: int, c_end: int) -> dict[str, int]:
    return {"c_start": c_start, "c_sent": c_sent, "c_end": c_end, "cpu_start": 0, "cpu_sent": 10_000,
            "cpu_end": 30_000, "ok": 1}


def _gateway(arrive: int, written: int, free: int) -> dict[str, int]:
    return {"arrive": arrive, "task": arrive + 1_000, "app": arrive + 2_000, "up_written": arrive + 3_000,
            "up_first": arrive + 5_000, "written": written, "cycle_end": free - 1_000, "loop_free": free,
            "cpu_written": 0, "cpu_free": free - written}


def test_tail_overlap_share_and_spans() -> None:
    # request 0's tail ends (loop free at 30 µs) after request 1 was sent (at 25 µs): N+1 waited on N's tail;
    # request 1's tail ends (52 µs) before request 2 was sent (60 µs)
    client = [_client(0, 2_000, 20_000), _client(22_000, 25_000, 45_000), _client(58_000, 60_000, 78_000)]
    gateway = [_gateway(3_000, 15_000, 30_000), _gateway(31_000, 40_000, 52_000), _gateway(61_000, 75_000, 77_000)]
    out = analyse(client, gateway)
    assert out["share of N+1 sent while busy with N"] == 0.5
    assert out["N+1 sent → N's loop free (when > 0)"] == 5.0
    assert out["mean of max(0, N's loop free − N+1 sent)"] == 2.5  # (5 + 0) / 2
    assert out["client latency"] == 20.0
    assert out["answer hop + client read"] == 5.0
    assert out["busy: written → loop free"] == 12.0


def test_stamps_outside_the_client_request_are_refused() -> None:
    # a gateway record that is not the client's request (misaligned index): refused, not averaged
    with pytest.raises(RuntimeError):
        analyse([_client(0, 2_000, 20_000)], [_gateway(25_000, 30_000, 31_000)])


def test_direct_rows_have_client_figures_only() -> None:
    out = analyse([_client(0, 2_000, 20_000), _client(21_000, 23_000, 41_000)], [])
    assert out["client latency"] == 20.0 and out["client turnaround c_end → next c_start"] == 1.0
    assert "share of N+1 sent while busy with N" not in out


def test_next_request_read_first_bounds_when_the_gateway_was_done() -> None:
    # N's done callback ran (40 µs) after N+1's data_received (32 µs): N was done by 32 µs at the latest
    client = [_client(0, 2_000, 20_000), _client(22_000, 25_000, 45_000)]
    gateway = [_gateway(3_000, 15_000, 40_000), _gateway(32_000, 40_000, 44_000)]
    out = analyse(client, gateway)
    assert out["share of N+1 sent while busy with N"] == 1.0
    assert out["N+1 sent → N's loop free (when > 0)"] == 7.0  # 32 - 25, not 40 - 25
