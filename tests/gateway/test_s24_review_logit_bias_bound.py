"""S24-review-2: ``logit_bias``'s entry bound (300) is checked before pydantic validates the map's entries
(a ``mode="before"`` validator), so a refused map of 65,000 entries costs its decode, not a validation of
each entry as well (~11 ms in process; bench/logit_bias_bound_cost.py). Behaviour-neutral for every
decoded body: a differential test against the schema as it was at the session's start (/tmp/s24-base or
the git object of 4300ab4) compares the accept/refuse verdict, the message and the param."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gateway.request_schema import ChatBody, CompletionBody, schema_error

ROOT = Path(__file__).resolve().parents[2]


def _old_schema(tmp: Path) -> ModuleType:
    """gateway/request_schema.py of 4300ab4 (session 24's start), imported under another name."""
    text = subprocess.run(["git", "-C", str(ROOT), "show", "4300ab4:gateway/request_schema.py"],
                          capture_output=True, text=True, check=True).stdout
    path = tmp / "old_request_schema.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("old_request_schema", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["old_request_schema"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def old(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    return _old_schema(tmp_path_factory.mktemp("old"))


def _verdict(model: Any, body: dict[str, Any]) -> tuple[str, str | None] | None:
    try:
        model.model_validate(body)
    except ValidationError as exc:
        return schema_error(exc)
    return None


_VALUES = st.one_of(st.integers(-200, 200), st.floats(-150, 150, allow_nan=False), st.booleans(), st.none(),
                    st.text(max_size=3), st.just([1]), st.just({"a": 1}))
_KEYS = st.one_of(st.integers(0, 10**10).map(str), st.text(max_size=4), st.just(""), st.just("0x1"))


@settings(max_examples=150, deadline=None)
@given(size=st.sampled_from([0, 1, 5, 299, 300, 301, 302, 1000]), key=_KEYS, value=_VALUES, at=st.integers(0, 2000),
       other=st.one_of(st.none(), st.just([]), st.just("x"), st.just(5), st.just([{"1": 1}])),
       completions=st.booleans())
def test_same_verdict_as_the_old_schema(old: ModuleType, size: int, key: str, value: Any, at: int, other: Any,
                                        completions: bool) -> None:
    bias: Any = {str(i): 1 for i in range(size)}
    if size:  # one entry replaced by a drawn key/value: bad keys and values past and within the bound
        del bias[str(at % size)]
        bias[key] = value
    for lb in (bias, other):
        body = ({"model": "m", "prompt": "x", "logit_bias": lb} if completions
                else {"model": "m", "messages": [{"role": "user", "content": "x"}], "logit_bias": lb})
        body = json.loads(json.dumps(body))  # as decoded from a request
        new_model = CompletionBody if completions else ChatBody
        old_model = old.CompletionBody if completions else old.ChatBody
        assert _verdict(new_model, body) == _verdict(old_model, body)


def test_more_than_300_entries_refused_before_the_entries_are_validated() -> None:
    """A map past the bound whose entries pydantic would also refuse (a non-string key: only a Python
    caller can send one) is refused for its size alone: the entries were not looked at."""
    bias = {i: 1 for i in range(301)}
    with pytest.raises(ValidationError) as info:
        ChatBody.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}], "logit_bias": bias})
    assert schema_error(info.value) == ("logit_bias: Value error, at most 300 entries", "logit_bias")
    assert info.value.error_count() == 1
