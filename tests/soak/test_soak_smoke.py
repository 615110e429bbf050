"""CI smoke version of the load/soak benchmark (``python -m bench.soak --smoke``).

The real harness: simulated replicas and the gateway as subprocesses
(``python -m gateway.cli serve``), about 10 s of open-loop trace load at
12 req/s, a short idle, SIGTERM, then the audit trail is counted and
verified. No timing assertions: only errors, audit completeness and fd
recovery.
"""

from __future__ import annotations

from pathlib import Path

from bench.soak import render_markdown, run_soak, smoke_settings


async def test_soak_smoke_no_5xx_no_lost_audit_record_fds_recover(tmp_path: Path):
    lines: list[str] = []
    rep = await run_soak(smoke_settings(), log=lines.append, workdir=tmp_path / "work")
    step = rep.steps[0]
    assert step.sent >= 100
    assert rep.total_5xx == 0
    assert step.errors == {} and step.ok == step.sent
    # every request has exactly one audit event, all allowed; the chain verifies and ends sealed
    a = rep.audit
    assert a is not None
    assert a.sent == a.answered == step.sent and a.inference_events == step.sent and a.lost == 0
    assert a.missing_request_ids == 0 and a.duplicates == 0
    assert a.outcomes == {"allowed": step.sent}
    assert a.verify_exit == 0, a.verify_output
    assert a.last_record_type == "checkpoint" and a.unsealed_records == 0
    assert rep.shutdown_exit_code == 0
    # fds back near baseline once the client closed its connections: no accepted connection
    # left open, nothing but (bounded, keep-alive) upstream connections above the baseline
    base, idle = rep.fds_detail["baseline"], rep.fds_detail["after idle"]
    assert idle["client"] == 0
    assert idle["listen"] == base["listen"]
    assert idle["upstream"] <= 64
    non_upstream = lambda d: sum(v for k, v in d.items() if k != "upstream")  # noqa: E731
    assert non_upstream(idle) <= non_upstream(base) + 2
    assert rep.fds_after_idle is not None and rep.fds_baseline is not None
    # the report renders and holds no prompt words (trace prompts are "b<id>w<j>" words)
    md = render_markdown(rep)
    assert "## Audit trail" in md and "b0w0" not in md
    work_logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "work" / "logs").glob("*.log"))
    assert "b0w0" not in work_logs and "Traceback" not in work_logs
