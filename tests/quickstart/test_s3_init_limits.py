"""Review findings R3-3 and R3-4: ``prefixgate-sim init`` writes token limits and the prefill bound,
and ``serve`` warns at start about tenants without a prompt-token limit.

Before the fix ``init`` gave each tenant ``rate_rps`` and ``max_concurrency`` only: a quickstart
tenant could send 1 MiB prompts at full speed, and with no
``flow.replica_max_queued_prefill_tokens`` the fair queue never held any of them back.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.auditing import AuditHub
from gateway.build import build
from gateway.config import load_config
from gateway.server import log_start_warnings
from sim.quickstart import init_gateway_dir
from tests.conftest import TD

TOKEN_KEYS = ("max_prompt_tokens", "max_output_tokens", "prompt_tokens_per_s", "prompt_tokens_burst",
              "output_tokens_per_s", "output_tokens_burst")


def _init_doc(tmp: Path) -> dict[str, Any]:
    res = init_gateway_dir(tmp / "gw", port=0, admin_port=0, replicas=1, replica_base_port=9)
    return yaml.safe_load(res.config.read_text(encoding="utf-8"))


def test_init_writes_token_limits_and_the_prefill_bound(tmp_path: Path) -> None:
    doc = _init_doc(tmp_path)
    for t in doc["tenancy"]["tenants"]:
        assert all(isinstance(t.get(k), int) and t[k] > 0 for k in TOKEN_KEYS), t
        # one prompt of the maximum size fits the prompt bucket and the prefill bound
        assert t["prompt_tokens_burst"] >= t["max_prompt_tokens"]
        # and one request of the largest batch too (review S15-5: serve warns otherwise)
        assert t["prompt_tokens_burst"] >= t["max_batch_prompts"] * t["max_prompt_tokens"]
        assert t["output_tokens_burst"] >= t["max_output_tokens"]  # a request without max_tokens reserves this
        assert doc["flow"]["replica_max_queued_prefill_tokens"] >= t["max_prompt_tokens"]
    c = build(load_config(tmp_path / "gw" / "gateway.yaml"), audit=AuditHub(None))
    assert c.configuration_warnings() == [] and c.limit_warnings() == []
    assert c.config.flow.replica_max_queued_prefill_tokens == doc["flow"]["replica_max_queued_prefill_tokens"]


def test_serve_warns_at_start_about_tenants_without_a_prompt_token_limit(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    doc = _init_doc(tmp_path)
    acme, globex = doc["tenancy"]["tenants"]
    del acme["prompt_tokens_per_s"], acme["prompt_tokens_burst"]
    for k in TOKEN_KEYS:
        globex.pop(k)
    cfg_file = tmp_path / "edited.yaml"
    cfg_file.write_text(yaml.safe_dump(doc))
    c = build(load_config(cfg_file), audit=AuditHub(None))
    with caplog.at_level(logging.WARNING, logger="prefixgate"):
        log_start_warnings(c)
    lines = [r.getMessage() for r in caplog.records if r.message.startswith("limits: ")]
    assert len(lines) == 2, lines
    assert lines[0].startswith("limits: tenant acme: no prompt_tokens_per_s:"), lines
    # globex sets no max_prompt_tokens, but limits.max_prompt_tokens (8192) bounds its prompts: only the
    # missing token rate is named, with the effective bound (session 22, S21-newcomer-8)
    assert lines[1].startswith("limits: tenant globex: no prompt_tokens_per_s:"), lines
    assert "limits.max_prompt_tokens 8192" in lines[1], lines
    assert all(r.levelno == logging.WARNING for r in caplog.records)


# --- the init configuration, served: the quickstart's requests pass, an oversized prompt does not ---

@pytest.fixture
def config_overrides(tmp_path: Path) -> dict[str, Any]:
    """The stack (tests/conftest.py) with init's tenants (their workloads in the tests' trust
    domain) and init's flow section."""
    doc = _init_doc(tmp_path / "init")
    tenants = [{**t, "spiffe_ids": [f"spiffe://{TD}/{t['id']}/"], "pools": ["default"]}
               for t in doc["tenancy"]["tenants"]]
    return {"tenancy": {"tenants": tenants}, "flow": {**doc["flow"], "shed_loop_lag_s": None}}


@pytest.fixture
def n_replicas() -> int:
    return 2


async def test_the_init_limits_serve_the_quickstart_and_refuse_an_oversized_prompt(stack: Any) -> None:
    acme, globex = stack.auth("acme/app"), stack.auth("globex/app")
    chat = {"model": "sim-model", "max_tokens": 16, "messages": [{"role": "user", "content": "Hello"}]}
    for headers in (acme, globex):
        r = await stack.client.post("/v1/chat/completions", headers=headers, json=chat)
        assert r.status_code == 200, r.text
    r = await stack.client.post("/v1/chat/completions", headers=acme, json={**chat, "stream": True})
    assert r.status_code == 200 and "data: [DONE]" in r.text, r.text
    no_cap = {k: v for k, v in chat.items() if k != "max_tokens"}  # reserves max_output_tokens: fits the bucket
    r = await stack.client.post("/v1/chat/completions", headers=globex, json=no_cap)
    assert r.status_code == 200, r.text
    big = " ".join(f"w{i}" for i in range(9000))  # over max_prompt_tokens (8192)
    r = await stack.client.post("/v1/completions", headers=acme,
                                json={"model": "sim-model", "prompt": big, "max_tokens": 2})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] in {"context_length_exceeded", "prompt_too_large"}
