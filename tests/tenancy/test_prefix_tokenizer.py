"""Tokenizer and HMAC block-hash chain (tenancy.tokenizer, tenancy.prefix)."""

from __future__ import annotations

import hashlib
import hmac
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenancy.prefix import block_hash_chain
from tenancy.tokenizer import (
    HuggingFaceTokenizer,
    TokenizerError,
    WordTokenizer,
    get_tokenizer,
    prompt_text,
    render_chat,
)

KEY_A = b"a" * 32
KEY_B = b"b" * 32


def test_word_tokenizer_is_deterministic_and_splits_words_and_symbols() -> None:
    t = WordTokenizer()
    ids = t.encode("Hello, world!  hello")
    assert len(ids) == 5  # Hello , world ! hello
    assert ids == WordTokenizer().encode("Hello, world!  hello")  # fresh instance, same ids
    assert ids[0] != ids[4]  # case matters
    assert t.encode("") == [] and t.encode("   \n") == []


def test_chain_definition_matches_the_documented_formula() -> None:
    tokens = list(range(40))
    chain = block_hash_chain(KEY_A, tokens, 16, key_id="kid1", digest_size=16)
    assert len(chain) == 2  # the trailing partial block (8 tokens) is not hashed
    prev = b"pg-prefix-v1" + b"kid1"
    for i, h in enumerate(chain):
        block = struct.pack(">16I", *tokens[i * 16:(i + 1) * 16])
        expect = hmac.new(KEY_A, prev + block, hashlib.sha256).digest()[:16]
        assert h == expect
        prev = expect


@given(st.lists(st.integers(0, 2**32 - 1), min_size=16, max_size=200))
def test_chains_of_two_tenants_or_two_key_versions_never_meet(tokens: list[int]) -> None:
    a = block_hash_chain(KEY_A, tokens, 16, key_id="t:a:v1")
    b = block_hash_chain(KEY_B, tokens, 16, key_id="t:b:v1")
    a2 = block_hash_chain(KEY_A, tokens, 16, key_id="t:a:v2")
    assert a and not set(a) & set(b) and not set(a) & set(a2)


def test_chain_keys_cover_the_whole_prefix() -> None:
    base = list(range(64))
    changed = base.copy()
    changed[3] = 999  # differs in block 0 only
    x = block_hash_chain(KEY_A, base, 16)
    y = block_hash_chain(KEY_A, changed, 16)
    assert all(p != q for p, q in zip(x, y))  # every later key differs too
    longer = block_hash_chain(KEY_A, base + list(range(100, 116)), 16)
    assert longer[:4] == x  # a shared prefix gives shared leading keys


@pytest.mark.parametrize("kw", [{"key": b"short"}, {"block_size": 0}, {"digest_size": 4}])
def test_chain_rejects_bad_arguments(kw: dict) -> None:
    args = {"key": KEY_A, "tokens": [1] * 32, "block_size": 16}
    digest = kw.pop("digest_size", None)
    args.update(kw)
    with pytest.raises(ValueError):
        block_hash_chain(args["key"], args["tokens"], args["block_size"], **({"digest_size": digest} if digest else {}))


def test_render_chat_makes_earlier_turns_a_prefix_of_later_ones() -> None:
    turn1 = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    turn2 = turn1 + [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    assert render_chat(turn2).startswith(render_chat(turn1))
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert render_chat(parts) == "<|user|>\na\nb\n"
    with pytest.raises(TokenizerError):
        render_chat([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])
    with pytest.raises(TokenizerError):
        render_chat([{"content": "no role"}])


def test_prompt_text_and_factory() -> None:
    assert prompt_text("completions", {"prompt": ["a", "b"]}) == "a\nb"
    with pytest.raises(TokenizerError):
        prompt_text("completions", {"prompt": 5})
    assert isinstance(get_tokenizer(None), WordTokenizer)
    with pytest.raises(TokenizerError):
        get_tokenizer("bpe")
    with pytest.raises(TokenizerError):
        HuggingFaceTokenizer("/nonexistent/tokenizer.json")


def test_huggingface_adapter_loads_a_local_tokenizer_json(tmp_path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    hf = get_tokenizer(f"hf:{path}")
    assert hf.encode("hello world zebra") == [1, 2, 0]
