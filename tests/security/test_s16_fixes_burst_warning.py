"""Review S15-5: one request may reserve more prompt tokens than its tenant's ``prompt_tokens_burst`` (a
bucket admits ``n`` when it holds ``min(n, burst)`` and goes into debt): a 4 x 5,000-word batch (20,000
tokens) was admitted from a full bucket of burst 16,384. The per-request bound is ``max_batch_prompts`` x
``max_prompt_tokens`` (effective values). Now ``serve`` (at start) and ``prefixgate config check`` print a
``limits:`` line for each tenant whose bound passes its burst (gateway/config_tenancy.py ``burst_warnings``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from gateway.auditing import AuditHub
from gateway.build import build
from gateway.cli import main
from gateway.config import load_config
from gateway.config_tenancy import burst_warnings, request_prompt_bound
from gateway.server import log_start_warnings
from sim.quickstart import init_gateway_dir
from tenancy.bounds import request_bounds
from tenancy.registry import TenantRegistry
from tenancy.tokenizer import WordTokenizer

TD = "demo.prefixgate.test"


def _tenant(tid: str, **kw: Any) -> dict[str, Any]:
    return {"id": tid, "spiffe_ids": [f"spiffe://{TD}/{tid}/"], "models": ["sim-model"], "pools": ["default"], **kw}


def _tenants(*entries: dict[str, Any]) -> list[Any]:
    return TenantRegistry.from_config(list(entries)).tenants()


#: the review's tenant: 4 x 8,192 = 32,768 tokens per request, burst 16,384
REVIEWED = _tenant("acme", max_concurrency=4, max_batch_prompts=4, max_prompt_tokens=8192,
                   prompt_tokens_per_s=4000, prompt_tokens_burst=16384)


def test_the_reviewed_tenant_is_warned_about() -> None:
    lines = burst_warnings(_tenants(REVIEWED), 8192)
    assert len(lines) == 1, lines  # before: no warning anywhere
    assert lines[0].startswith("tenant acme:") and "32768" in lines[0] and "16384" in lines[0]


@pytest.mark.parametrize("entry, default, warned", [
    (_tenant("a", max_concurrency=4, max_batch_prompts=2, max_prompt_tokens=8192, prompt_tokens_per_s=1,
             prompt_tokens_burst=16384), 8192, False),  # 2 x 8192 = the burst: within it
    (_tenant("a", max_concurrency=4, max_batch_prompts=2, max_prompt_tokens=8192, prompt_tokens_per_s=1,
             prompt_tokens_burst=16383), 8192, True),  # one token over
    (_tenant("a", max_prompt_tokens=8192), 8192, False),  # no prompt-token bucket: nothing to pass
    (_tenant("a", max_concurrency=2, prompt_tokens_per_s=10000), 4096, False),  # 2 (concurrency) x 4096 (default) <= 10000 (burst = rate)
    (_tenant("a", max_concurrency=3, prompt_tokens_per_s=10000), 4096, True),  # 3 x 4096 > 10000
    (_tenant("a", prompt_tokens_per_s=100000), 8192, True),  # 16 (default batch) x 8192 > 100000
    (_tenant("a", prompt_tokens_per_s=10), None, False),  # no token limit at all: limit_warnings' case
])
def test_the_bound_against_the_burst(entry: dict[str, Any], default: int | None, warned: bool) -> None:
    assert bool(burst_warnings(_tenants(entry), default)) is warned


@pytest.mark.parametrize("entry", [
    REVIEWED, _tenant("b"), _tenant("c", max_concurrency=3), _tenant("d", max_prompt_tokens=100),
    _tenant("e", max_concurrency=8, max_batch_prompts=8, max_prompt_tokens=5),
])
@pytest.mark.parametrize("default", [None, 4096])
def test_the_bound_is_the_request_bounds_product(entry: dict[str, Any], default: int | None) -> None:
    """The warning reads the same effective values as admission (tenancy/bounds.py ``request_bounds``)."""
    tenant = _tenants(entry)[0]
    b = request_bounds(tenant, WordTokenizer(), max_messages_ceiling=2048, default_max_prompt_tokens=default)
    expected = None if b.max_prompt_tokens is None else b.max_batch_prompts * b.max_prompt_tokens
    assert request_prompt_bound(tenant, default) == expected


def _write(tmp_path: Path, tenants: list[dict[str, Any]]) -> Path:
    doc = {"replicas": [{"id": "r0", "url": "http://127.0.0.1:9", "pool": "default"}], "models": ["sim-model"],
           "tenancy": {"tenants": tenants}}
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def test_config_check_prints_the_warning(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["config", "check", "--config", str(_write(tmp_path, [REVIEWED]))])
    assert res.exit_code == 0, res.output  # a warning, not an error
    lines = [ln for ln in res.output.splitlines() if ln.startswith("limits: tenant acme: one request may reserve")]
    assert len(lines) == 1, res.output
    within = dict(REVIEWED, prompt_tokens_burst=32768)
    res = CliRunner().invoke(main, ["config", "check", "--config", str(_write(tmp_path, [within]))])
    assert res.exit_code == 0 and "one request may reserve" not in res.output, res.output


def test_serve_logs_it_at_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    res = init_gateway_dir(tmp_path / "gw", port=0, admin_port=0, replicas=1, replica_base_port=9)
    doc = yaml.safe_load(res.config.read_text(encoding="utf-8"))
    first = doc["tenancy"]["tenants"][0]
    assert build(load_config(res.config), audit=AuditHub(None)).limit_warnings() == []  # the quickstart: within
    first["prompt_tokens_burst"] = first["max_batch_prompts"] * first["max_prompt_tokens"] - 1
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(doc), encoding="utf-8")
    c = build(load_config(edited), audit=AuditHub(None))
    with caplog.at_level(logging.WARNING, logger="prefixgate"):
        log_start_warnings(c)
    lines = [r.getMessage() for r in caplog.records if "one request may reserve" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(f"limits: tenant {first['id']}:"), lines


# --- review R16-1: the output bucket, and the lines again after a reload

OUT = _tenant("o", max_concurrency=4, max_batch_prompts=4, max_output_tokens=256,
              output_tokens_per_s=10, output_tokens_burst=10)


@pytest.mark.parametrize("entry, default_out, warned", [
    (OUT, 32768, True),  # 4 x 256 = 1,024 output tokens from a burst of 10 (the review's ledger case)
    (_tenant("o", max_batch_prompts=4, max_output_tokens=256, output_tokens_per_s=1, output_tokens_burst=1024),
     32768, False),  # exactly the burst
    (_tenant("o", max_batch_prompts=4, max_output_tokens=256, output_tokens_per_s=1, output_tokens_burst=1023),
     32768, True),  # one token over
    (_tenant("o", max_batch_prompts=2, output_tokens_per_s=5000), 2048, False),  # 2 x 2048 (gateway cap) <= 5000
    (_tenant("o", max_batch_prompts=3, output_tokens_per_s=5000), 2048, True),  # 3 x 2048 > 5000
    (_tenant("o", max_batch_prompts=4, max_output_tokens=256), 32768, False),  # no output bucket
])
def test_the_output_bound_against_the_output_burst(entry: dict[str, Any], default_out: int, warned: bool) -> None:
    lines = burst_warnings(_tenants(entry), None, default_out)
    assert bool(lines) is warned, lines
    if warned:
        assert "output tokens" in lines[0] and "output_tokens_burst" in lines[0]


def test_a_reload_logs_the_limits_lines_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    result = init_gateway_dir(tmp_path / "gw", port=0, admin_port=0, replicas=1, replica_base_port=9)
    gw = build(load_config(result.config), audit=AuditHub(None), config_path=str(result.config))
    entry = dict(OUT, spiffe_ids=[f"spiffe://{result.trust_domain}/o/"])
    tenants = [*gw.admin.last_tenancy["tenants"], entry] if gw.admin.last_tenancy else [entry]
    with caplog.at_level(logging.WARNING, logger="prefixgate"):
        gw.admin.apply_registry(tenants, [])
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("limits: tenant o:")]
    # since session 23 (S23-newcomer-5) the reload logs every start-up line, the prompt-rate line first
    assert any("1024 output tokens" in line for line in lines), lines
