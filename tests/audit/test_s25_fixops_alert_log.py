"""S24-newcomer-8 (session 25 fixops): a concentration alert writes a log line when raised (WARNING)
and when cleared (INFO), rate-bounded per alert id so a flapping alert cannot flood the log."""
from __future__ import annotations

import asyncio
import logging
import random

import pytest

from audit.alert_log import LOGGER_NAME, AlertLogLines
from audit.concentration import ConcentrationMonitor
from audit.event import Outcome


def _run(mon: ConcentrationMonitor, pick, seconds: float, t0: float = 0.0, rate: int = 20) -> float:
    t = t0
    while t < t0 + seconds:
        mon.observe("p", pick(), prefill_tokens=40, prompt_tokens=100, cached_tokens=60, now=t, tenant="t1")
        t += 1 / rate
    return t


def _lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER_NAME]


def test_raise_logs_a_warning_and_clear_an_info_with_ids_and_figures(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    alerts: list = []
    now = [0.0]
    mon = ConcentrationMonitor(window_s=10, hold_s=5, on_alert=alerts.append, clock=lambda: now[0])
    rng = random.Random(2)
    t = _run(mon, lambda: rng.choice("abcd"), 30)
    t = _run(mon, lambda: "a" if rng.random() < 0.8 else rng.choice("bcd"), 40, t0=t)
    raised = [r for r in _lines(caplog) if r.levelno == logging.WARNING]
    assert len(raised) == len([a for a in alerts if a.outcome is Outcome.RAISED]) >= 1
    rep = next(r.getMessage() for r in raised if "kind=replica_concentration" in r.getMessage())
    event = next(a.alert for a in alerts if a.alert["alert_kind"] == "replica_concentration")
    assert rep.startswith("concentration alert raised: ")
    assert "replica=a" in rep and f"share={event['value']}" in rep and f"threshold={event['threshold']}" in rep
    assert "window_s=10" in rep and "pool=p" in rep
    now[0] = 1_000.0  # past the rate bound's interval: the clears are logged at once
    _run(mon, lambda: rng.choice("abcd"), 40, t0=t)
    cleared = [r for r in _lines(caplog) if r.levelno == logging.INFO]
    assert len(cleared) == len([a for a in alerts if a.outcome is Outcome.CLEARED]) >= 1
    assert all(r.getMessage().startswith("concentration alert cleared: ") for r in cleared)


def _alert(alert_id: str = "replica_concentration:p:a") -> dict[str, object]:
    return {"alert_id": alert_id, "alert_kind": "replica_concentration", "pool": "p", "replica": "a",
            "value": 0.9, "threshold": 0.4, "observed_at_s": 1.0}


def test_a_flapping_alert_writes_one_line_and_one_summary_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    now = [0.0]
    lines = AlertLogLines(window_s=60, interval_s=60, clock=lambda: now[0])
    for i in range(50):  # 50 raise/clear cycles in 50 s
        now[0] = float(i)
        lines.note(Outcome.RAISED, _alert())
        lines.note(Outcome.CLEARED, _alert())
    assert [r.levelno for r in _lines(caplog)] == [logging.WARNING]
    lines.note(Outcome.RAISED, _alert("pool_concentration:p:"))  # another id is not held back by this one
    assert len(_lines(caplog)) == 2
    now[0] = 60.0
    lines.flush()
    summary = _lines(caplog)[-1]
    assert summary.levelno == logging.INFO  # the state it ends in: cleared
    assert "(49 raised, 50 cleared in the last 60 s not logged: rate bound)" in summary.getMessage()
    lines.flush()
    assert len(_lines(caplog)) == 3


def test_summary_is_written_by_a_timer_on_the_running_loop(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)

    async def scenario() -> None:
        lines = AlertLogLines(window_s=60, interval_s=0.05)
        lines.note(Outcome.RAISED, _alert())
        lines.note(Outcome.CLEARED, _alert())
        lines.note(Outcome.RAISED, _alert())
        for _ in range(500):  # wait for the summary (bounded), no fixed sleep
            if len(_lines(caplog)) == 2:
                break
            await asyncio.sleep(0.01)

    asyncio.run(scenario())
    got = _lines(caplog)
    assert len(got) == 2 and got[1].levelno == logging.WARNING  # ends raised
    assert "(1 raised, 1 cleared" in got[1].getMessage()


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError):
        AlertLogLines(window_s=60, interval_s=0)


def test_close_writes_the_pending_summary_of_an_interval_not_ended(caplog: pytest.LogCaptureFixture) -> None:
    """S25-fixops-4 (lead): at the gateway's stop a change counted, not logged, is written at once."""
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    now = [0.0]
    lines = AlertLogLines(window_s=60, interval_s=60, clock=lambda: now[0])
    lines.note(Outcome.RAISED, _alert())
    now[0] = 5.0
    lines.note(Outcome.CLEARED, _alert())  # inside the interval: counted only
    assert [r.levelno for r in _lines(caplog)] == [logging.WARNING]
    lines.close()
    got = _lines(caplog)
    assert [r.levelno for r in got] == [logging.WARNING, logging.INFO]
    assert got[-1].getMessage().startswith("concentration alert cleared (0 raised, 1 cleared")
    lines.close()  # nothing pending: nothing more
    assert len(_lines(caplog)) == 2


def test_hub_close_writes_the_monitors_pending_alert_lines(caplog: pytest.LogCaptureFixture) -> None:
    from gateway.auditing import AuditHub

    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    now = [0.0]
    mon = ConcentrationMonitor(window_s=10, hold_s=5, on_alert=lambda _e: None, clock=lambda: now[0])
    mon.alert_log.note(Outcome.RAISED, _alert())
    mon.alert_log.note(Outcome.CLEARED, _alert())
    asyncio.run(AuditHub(None, mon).close())
    assert [r.levelno for r in _lines(caplog)] == [logging.WARNING, logging.INFO]
