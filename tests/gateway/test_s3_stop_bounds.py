"""R3-8: ``stop`` sequences are capped (count and length) and counted in the prompt byte bound."""

from __future__ import annotations

import json

import pytest

from gateway.errors import GatewayError
from gateway.request import parse_inference_request
from tenancy.bounds import MAX_STOP_CHARS, MAX_STOP_SEQUENCES, STOP_BYTES_ALLOWANCE, request_bounds
from tenancy.registry import Tenant
from tenancy.tokenizer import WordTokenizer


def _chat(**kw: object) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}).encode()


def _completion(**kw: object) -> bytes:
    return json.dumps({"model": "m", "prompt": ["ab", "c"], **kw}).encode()


def test_documented_caps() -> None:
    assert MAX_STOP_SEQUENCES == 4 and MAX_STOP_CHARS == 256
    assert STOP_BYTES_ALLOWANCE == 4 * 256 * 4  # 4 sequences x 256 characters x 4 UTF-8 bytes


@pytest.mark.parametrize("stop", ["x" * 900_000, ["ok", "x" * 257], "\u00e9" * 257])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_long_stop_sequence_is_refused(endpoint: str, stop: object) -> None:
    raw = _chat(stop=stop) if endpoint == "chat" else _completion(stop=stop)
    with pytest.raises(GatewayError) as exc:
        parse_inference_request(raw, endpoint)  # type: ignore[arg-type]
    err = exc.value
    assert err.status == 400 and err.code == "invalid_request"
    assert "256 characters" in err.message and "x" * 20 not in err.message


def test_five_stop_sequences_are_refused() -> None:
    with pytest.raises(GatewayError) as exc:
        parse_inference_request(_chat(stop=["a", "b", "c", "d", "e"]), "chat")
    assert exc.value.code == "invalid_request" and "at most 4" in exc.value.message


def test_stop_at_the_caps_is_accepted_and_counted_in_prompt_bytes() -> None:
    stop = ["\u00e9" * 256] * 4  # 4 x 512 UTF-8 bytes
    base = parse_inference_request(_chat(), "chat")
    req = parse_inference_request(_chat(stop=stop), "chat")
    assert req.body["stop"] == stop
    assert req.prompt_bytes[0] == base.prompt_bytes[0] + 4 * 512
    one = parse_inference_request(_chat(stop="zz"), "chat")
    assert one.prompt_bytes[0] == base.prompt_bytes[0] + 2
    # a batch: counted once, with the first sequence (like the chat extras)
    creq = parse_inference_request(_completion(stop=["xyz"]), "completions")
    assert creq.prompt_bytes == (2 + 3, 1)
    # not prompt tokens: never part of the text that is tokenized or hashed
    assert "zz" not in one.extra_text and "zz" not in one.text


def test_the_derived_byte_bound_leaves_room_for_stop_sequences() -> None:
    t = Tenant(id="t", max_prompt_tokens=100)
    tok = WordTokenizer()
    b = request_bounds(t, tok, max_messages_ceiling=1000)
    assert b.max_prompt_bytes == tok.max_text_bytes(101) + STOP_BYTES_ALLOWANCE
    explicit = Tenant(id="t", max_prompt_tokens=100, max_prompt_bytes=500)
    assert request_bounds(explicit, tok, max_messages_ceiling=1000).max_prompt_bytes == 500


def test_engine_specific_guided_decoding_fields_are_not_forwarded() -> None:
    raw = _chat(guided_regex="(a+)+$", guided_json={"type": "object"}, structured_outputs={"regex": "x"},
                response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": {}}})
    with pytest.raises(GatewayError) as exc:  # session 23: refused by default (limits.unknown_fields)
        parse_inference_request(raw, "chat")
    assert exc.value.code == "unsupported_parameter" and exc.value.param == "guided_regex"
    req = parse_inference_request(raw, "chat", unknown_fields="drop")
    assert req.dropped == (3, "guided_regex,guided_json,structured_outputs")
    assert set(req.body) == {"model", "messages", "stream", "response_format"}
    assert "json_schema" in req.extra_text  # response_format is counted as prompt tokens
