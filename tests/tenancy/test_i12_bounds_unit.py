"""Issue 12, findings 2, 3 and 5, unit level: bounded tokenizing, derived bounds,
batch accounting in the limiter and the router, the user pseudonym."""

from __future__ import annotations

import zlib
import secrets
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import GatewayError
from gateway.request import parse_inference_request
from routing.index import InProcessPrefixIndex
from routing.load import InProcessLoadTracker
from routing.policies import RouteRequest, build_policy
from routing.router import Router
from policy.input import PolicyInputError, build_policy_input
from tenancy.bounds import request_bounds
from tenancy.keys import KeyRing, derive_prefix_key, user_pseudonym
from tenancy.limits import ConcurrencyLimited, RateLimited, TenantLimiter
from tenancy.registry import Tenant, TenantConfigError, TenantRegistry
from tenancy.tokenizer import MAX_TOKEN_CHARS, HuggingFaceTokenizer, WordTokenizer

MIB = 1 << 20


def _blake(word: str) -> int:
    """A token's id (session 3: CRC-32, name ``word-crc32-v2``; was BLAKE2b-32)."""
    return zlib.crc32(word.encode())


# ------------------------------------------------------------------ tokenizer

@pytest.mark.parametrize("text", [
    "a" * MIB,                      # one run of word characters
    "a " * (MIB // 2),              # many short words
    " " * MIB,                      # one blank run
    "!" * MIB,                      # symbols
    "\u3000" * (MIB // 3),          # a 3-byte blank run
    ("x" * 200 + " " * 100) * 4000,
])
def test_early_stop_produces_at_most_limit_plus_one(text: str) -> None:
    ids = WordTokenizer().encode(text, 100)
    assert 100 < len(ids) <= 101
    assert ids == WordTokenizer().encode(text)[:101]  # the same ids as a full encode


def test_long_words_and_blank_runs_are_cut_into_64_character_tokens() -> None:
    tok = WordTokenizer()
    assert MAX_TOKEN_CHARS == 64
    assert tok.encode("x" * 130) == [_blake("x" * 64), _blake("x" * 64), _blake("xx")]
    assert tok.encode("a" + " " * 64 + "b") == [_blake("a"), _blake("b")]  # a short blank run separates
    assert tok.encode("a" + " " * 65 + "b") == [_blake("a"), _blake(" " * 64), _blake(" "), _blake("b")]
    # ordinary text keeps its ids: prefix chains of ordinary prompts do not change
    assert tok.encode("Hello, world!  hello") == [_blake(w) for w in ["Hello", ",", "world", "!", "hello"]]


WORST_WORD = "\U0001d400" * 64  # MATHEMATICAL BOLD CAPITAL A: a 4-byte word character
WORST_GAP = "\u3000" * 64        # the widest free separator: 64 three-byte blanks


@pytest.mark.parametrize("tokens", [0, 1, 7, 100])
def test_byte_bound_holds_for_the_worst_case_text(tokens: int) -> None:
    tok = WordTokenizer()
    assert WORST_WORD.isidentifier() and len(WORST_WORD.encode()) == 256
    text = WORST_GAP + "".join(WORST_WORD + WORST_GAP for _ in range(tokens))
    assert len(tok.encode(text)) == tokens
    assert len(text.encode()) <= tok.max_text_bytes(tokens)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(["a", "\U0001d400", " ", "\u3000", "!", "\n", "é"]), max_size=3000))
def test_byte_bound_never_refuses_what_the_token_count_allows(text: str) -> None:
    tok = WordTokenizer()
    assert len(text.encode()) <= tok.max_text_bytes(len(tok.encode(text)))


def test_huggingface_refuses_bytes_above_limit_times_longest_token_before_encoding(tmp_path, monkeypatch) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "a": 3}
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    t.save(str(path))
    hf = HuggingFaceTokenizer(str(path))
    assert hf.max_token_bytes == 5 and hf.max_text_bytes(100) == 500

    calls: list[int] = []

    class Spy:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def encode(self, text: str, **kw: Any) -> Any:
            calls.append(len(text))
            return self.inner.encode(text, **kw)

    monkeypatch.setattr(hf, "_tok", Spy(hf._tok))
    assert len(hf.encode("a " * MIB, 100)) == 101 and calls == []  # refused on its size
    assert hf.encode("hello world a", 100) == [1, 2, 3] and calls == [13]
    assert len(hf.encode("a " * 240, 100)) == 101  # within the byte bound: encoded, cut to limit + 1


# ------------------------------------------------------------------ derived bounds

def _tenant(**kw: Any) -> Tenant:
    return Tenant(id="t", **kw)


def test_default_bounds_are_derived_from_the_token_limit() -> None:
    tok = WordTokenizer()
    b = request_bounds(_tenant(max_prompt_tokens=100), tok, max_messages_ceiling=2048)
    assert b.max_prompt_bytes == 7 * 64 * 102 + 4096 and b.max_messages == 20 and b.max_batch_prompts == 16
    b = request_bounds(_tenant(), tok, max_messages_ceiling=2048)
    assert b.max_prompt_bytes is None and b.max_messages == 2048
    b = request_bounds(_tenant(max_prompt_tokens=10**6, max_concurrency=4), tok, max_messages_ceiling=2048)
    assert b.max_messages == 2048 and b.max_batch_prompts == 4  # the ceiling; the concurrency
    b = request_bounds(_tenant(max_prompt_tokens=100, max_prompt_bytes=1000, max_messages=3, max_batch_prompts=2),
                       tok, max_messages_ceiling=2048)
    assert (b.max_prompt_bytes, b.max_messages, b.max_batch_prompts) == (1000, 3, 2)


def test_derived_message_bound_admits_every_prompt_the_token_limit_admits() -> None:
    tok = WordTokenizer()
    limit = 100
    bound = request_bounds(_tenant(max_prompt_tokens=limit), tok, max_messages_ceiling=2048).max_messages
    from tenancy.tokenizer import render_chat

    # the most messages a 100-token prompt can hold: empty contents, 5 tokens each
    most = [{"role": "user", "content": ""}] * (limit // 5)
    assert len(tok.encode(render_chat(most))) <= limit and len(most) <= bound
    over = most + [{"role": "user", "content": ""}]
    assert len(tok.encode(render_chat(over))) > limit


def test_max_batch_prompts_above_concurrency_is_a_configuration_error() -> None:
    doc = {"id": "t", "spiffe_ids": ["spiffe://td/t/"], "max_concurrency": 4}
    assert TenantRegistry.from_config([{**doc, "max_batch_prompts": 4}]).get("t").max_batch_prompts == 4
    with pytest.raises(TenantConfigError, match="max_batch_prompts.*max_concurrency"):
        TenantRegistry.from_config([{**doc, "max_batch_prompts": 5}])
    with pytest.raises(TenantConfigError, match="forward_user"):
        TenantRegistry.from_config([{**doc, "forward_user": "raw"}])


# ------------------------------------------------------------------ parsing

def test_message_count_checked_before_schema_validation() -> None:
    body = b'{"model": "m", "messages": [' + b",".join([b'{"role": 1}'] * 30) + b"]}"
    with pytest.raises(GatewayError) as exc:
        parse_inference_request(body, "chat", max_messages=20)
    assert exc.value.code == "too_many_messages"  # counted before the (invalid) messages were validated
    body = b'{"model": "m", "prompt": [' + b",".join([b'"a"'] * 17) + b"]}"
    with pytest.raises(GatewayError) as exc:
        parse_inference_request(body, "completions", max_batch_prompts=16)
    assert exc.value.code == "batch_too_large"


def test_parsed_request_counts_extras_and_drops_user() -> None:
    body = (b'{"model": "m", "user": "alice", "tools": [{"type": "function", "function": {"name": "lookup"}}],'
            b' "messages": [{"role": "user", "content": "hi", "name": "bob"}]}')
    req = parse_inference_request(body, "chat")
    assert "user" not in req.body and req.sequences == 1
    assert "lookup" in req.extra_text and "bob" in req.extra_text
    assert req.prompt_bytes == (len(req.text.encode()) + len(req.extra_text.encode()),)
    req = parse_inference_request(b'{"model": "m", "prompt": ["a", "bb", "c"]}', "completions")
    assert req.sequences == 3 and req.prompt_bytes == (1, 2, 1) and req.extra_text == ""


# ------------------------------------------------------------------ batch accounting

def test_batch_sequences_take_concurrency_slots_and_request_units() -> None:
    lim = TenantLimiter(clock=lambda: 0.0)
    t = _tenant(max_concurrency=4)
    lease = lim.admit(t)
    lim.add_sequences(t, lease, 3)
    assert lim.in_flight("t") == 4 and lease.weight == 4
    with pytest.raises(ConcurrencyLimited):
        lim.admit(t)
    lease.release()
    assert lim.in_flight("t") == 0
    first = lim.admit(t)
    with pytest.raises(ConcurrencyLimited):
        lim.add_sequences(t, first, 4)  # 5 slots asked, 4 exist: nothing taken
    assert lim.in_flight("t") == 1
    first.release()

    rated = _tenant(rate_rps=1.0, rate_burst=4.0)
    lease = lim.admit(rated, now=0.0)
    lim.add_sequences(rated, lease, 5, now=0.0)  # a batch above the burst goes into debt when the bucket was full
    lease.release()
    with pytest.raises(RateLimited):
        lim.admit(rated, now=1.0)  # 4 - 6 + 1 < 1: the debt delays the next request


def test_router_load_counts_every_sequence() -> None:
    router = Router(build_policy("least_load", {}), InProcessPrefixIndex(100), InProcessLoadTracker(), 16)
    req = RouteRequest(tenant_id="t", block_keys=(), prompt_tokens=30, max_tokens=3 * 10, block_size=16, sequences=3)
    choice, ticket = router.route(req, ["r0"])
    load = router.loads.snapshot("r0")
    assert load.running_requests == 3 and load.decode_tokens == 30
    ticket.finish()
    assert router.loads.snapshot("r0").running_requests == 0


def test_policy_input_carries_sequences() -> None:
    ident = {"spiffe_id": "spiffe://td/a", "trust_domain": "td", "claims": {}}
    req = {"endpoint": "/v1/completions", "model": "m", "prompt_tokens": 3, "max_tokens": 4, "stream": False}
    assert build_policy_input(ident, {"id": "t"}, req, [], [], 0.0)["request"]["sequences"] == 1
    assert build_policy_input(ident, {"id": "t"}, {**req, "sequences": 5}, [], [], 0.0)["request"]["sequences"] == 5
    with pytest.raises(PolicyInputError):
        build_policy_input(ident, {"id": "t"}, {**req, "sequences": 0}, [], [], 0.0)


# ------------------------------------------------------------------ user pseudonym

def test_user_pseudonym_stable_per_workload_and_independent_of_prefix_keys() -> None:
    master = secrets.token_bytes(32)
    ring = KeyRing(master)
    a1 = ring.user_pseudonym("t", "spiffe://td/t/app1")
    assert a1 == user_pseudonym(master, "t", "spiffe://td/t/app1") and a1.startswith("pgu1_") and len(a1) == 29
    ring.rotate_tenant("t")
    ring.rotate_salt("t")
    assert ring.user_pseudonym("t", "spiffe://td/t/app1") == a1  # prefix-key and salt rotation keep it
    assert ring.user_pseudonym("t", "spiffe://td/t/app2") != a1
    assert ring.user_pseudonym("u", "spiffe://td/t/app1") != a1
    key = derive_prefix_key(master, "t", 1)
    assert key.hex() not in a1
    ring.rotate_master(secrets.token_bytes(32))
    assert ring.user_pseudonym("t", "spiffe://td/t/app1") != a1  # only the master secret changes it
