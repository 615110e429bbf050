"""Session 23, fixreg (S22-fixops-1): the policy admin API's JSON reader refused ``NaN``/``Infinity`` but read
``1e400`` as ``inf`` (``{"a": inf}`` reached the store; json.dumps then writes ``Infinity``, not JSON). It now
refuses a number beyond a double with the gateway's rule (one rule, :mod:`policy.json_numbers`, which
:mod:`gateway.json_fast` takes too): 400 ``invalid_parameter`` "body is not valid JSON: number out of range: ...",
nothing stored, one failure record. Before: 200, the store given ``inf``.
"""
from __future__ import annotations

import math
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.testclient import TestClient

import gateway.json_fast
import policy.json_numbers
from policy.admin import admin_routes
from policy.store import ChangeRecord

OPERATOR = "spiffe://td/ops/alice"
JSON = {"Content-Type": "application/json"}


async def authorize(request: Request) -> dict[str, str]:
    return {"spiffe_id": OPERATOR}


class RecordingStore:
    """Keeps every document ``put_data`` is given."""

    version = 0

    def __init__(self) -> None:
        self.documents: list[Any] = []

    async def put_data(self, path: str, value: Any, who: str, *, client_address: str | None = None) -> ChangeRecord:
        self.documents.append(value)
        return ChangeRecord(version=1, who=who, kind="data", op="put", target=path, old_sha256=None,
                            new_sha256=None, time=0.0)


def _put(body: bytes) -> tuple[Any, RecordingStore, list[dict[str, Any]]]:
    store, failures = RecordingStore(), []
    client = TestClient(Starlette(routes=admin_routes(store, authorize, on_failure=failures.append)))  # type: ignore[arg-type]
    return client.put("/admin/data/extra/doc", content=body, headers=JSON), store, failures


@pytest.mark.parametrize("literal", ["1e400", "-2e308", "1" * 400 + ".0", "1.7976931348623159e308"])
def test_a_number_beyond_a_double_is_refused_with_the_gateways_rule(literal: str) -> None:
    resp, store, failures = _put(b'{"a": {"b": [1, %s]}}' % literal.encode())
    assert resp.status_code == 400, resp.text  # was 200, {"a": {"b": [1, inf]}} stored
    error = resp.json()["error"]
    assert error["code"] == "invalid_parameter"
    assert error["message"] == f"body is not valid JSON: {policy.json_numbers.NumberOutOfRange(literal)}"
    assert error["message"].startswith("body is not valid JSON: number out of range: ")
    assert store.documents == []
    assert [(f["status"], f["error_code"]) for f in failures] == [(400, "invalid_parameter")]


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_keep_their_400(literal: str) -> None:
    resp, store, _ = _put(b'{"a": %s}' % literal.encode())
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_parameter"
    assert f"{literal} is not a JSON value" in resp.json()["error"]["message"]
    assert store.documents == []


def test_finite_numbers_underflow_and_the_same_text_in_a_string_are_accepted() -> None:
    resp, store, failures = _put(b'{"a": 1e308, "b": 1e-400, "c": "1e400", "d": -0.5, "e": 12}')
    assert resp.status_code == 200, resp.text
    assert store.documents == [{"a": 1e308, "b": 0.0, "c": "1e400", "d": -0.5, "e": 12}]
    assert all(not isinstance(v, float) or math.isfinite(v) for v in store.documents[0].values())
    assert failures == []


def test_one_rule_the_gateway_takes_the_same_one() -> None:
    assert gateway.json_fast.NumberOutOfRange is policy.json_numbers.NumberOutOfRange
    assert gateway.json_fast.NonFiniteLiteral is policy.json_numbers.NonFiniteLiteral
