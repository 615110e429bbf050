"""S24-newcomer-4 (session 25 fixops): a request's audit event names the policy version that decided it
(``policy.version``, schema "6": the admin API's ``version``) in every format: JSONL (the event's JSON, also
the OTLP log body), OCSF ``actor.authorizations[].policy.version`` (OCSF's own attribute, a string), CEF
``flexNumber1`` / ``policyVersion``. An operator's change moves it for the requests decided after it.

Before: the event had no such field; a security team could rebuild the version only from the operator
events before it in the same chain.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from audit.cef import cef_line, format_cef, parse_cef
from audit.encoded import shared_json
from audit.ocsf import ocsf_line, to_ocsf, validate_ocsf
from audit.request_event import REQUEST_ROW_FIELDS
from tests.support.policy_store import policy_store_section

TIERS = "prefixgate/config/tiers"
WORKLOADS = "prefixgate/config/workloads"
TD = "demo.prefixgate.test"
BODY = {"model": "sim-model", "prompt": "policy version " + " ".join(f"w{i}" for i in range(20)), "max_tokens": 4}


@pytest.fixture
def config_overrides(tmp_path: Path) -> dict[str, Any]:
    return {"policy": policy_store_section(tmp_path)}


def _requests(log: Any) -> list[Any]:
    return [e for e in log.events if getattr(e, "endpoint", None) == "/v1/completions"]


def _formats(event: Any) -> dict[str, Any]:
    """``policy.version`` as each format writes it."""
    ocsf_fast, ocsf_full = json.loads(ocsf_line(event)), to_ocsf(event)
    validate_ocsf(ocsf_full)  # ocsf-emitter's 1.5.0 models accept the attribute
    _, ext = parse_cef(cef_line(event))
    assert cef_line(event) == format_cef(event) and ocsf_fast == json.loads(json.dumps(ocsf_full))
    return {"jsonl": json.loads(shared_json(event, keep=False)).get("policy", {}).get("version"),
            "ocsf": ocsf_fast["actor"]["authorizations"][0]["policy"].get("version"),
            "cef": (ext.get("flexNumber1Label"), ext.get("flexNumber1"))}


async def test_the_version_in_force_reaches_every_format(stack: Any, audit_log: Any) -> None:
    r = await stack.client.post("/v1/completions", headers=stack.auth("tenant-a/app"), json=BODY)
    assert r.status_code == 200, r.text
    [first] = _requests(audit_log)
    assert first.policy.version == 0 and first.policy.decision_id
    assert _formats(first) == {"jsonl": 0, "ocsf": "0", "cef": ("policyVersion", "0")}

    store = stack.components.pdp.store
    tiers = store.get_data(TIERS)
    tiers["standard"] = {"max_tokens": 8}
    await store.put_data(TIERS, tiers, "ops")  # version 1 (the decision cache is cleared)
    r = await stack.client.post("/v1/completions", headers=stack.auth("tenant-a/app"), json=BODY)
    assert r.status_code == 200, r.text
    second = _requests(audit_log)[-1]
    assert second.policy.version == 1 == store.version
    assert _formats(second) == {"jsonl": 1, "ocsf": "1", "cef": ("policyVersion", "1")}
    assert "policy_version" in REQUEST_ROW_FIELDS  # the row the audit worker builds the event from carries it


async def test_a_denied_request_names_the_version_that_denied_it(stack: Any, audit_log: Any) -> None:
    store = stack.components.pdp.store
    workloads = store.get_data(WORKLOADS)
    await store.put_data(WORKLOADS, {**workloads, "denied": [*workloads["denied"], f"spiffe://{TD}/tenant-a/app"]},
                         "ops")  # version 1 denies this workload
    r = await stack.client.post("/v1/completions", headers=stack.auth("tenant-a/app"), json=BODY)
    assert r.status_code == 403 and r.json()["error"]["code"] == "workload_denied", r.text
    [event] = _requests(audit_log)
    assert (event.outcome.value, event.policy.reason_code, event.policy.version) == ("denied", "workload_denied", 1)
    assert _formats(event)["cef"] == ("policyVersion", "1")
