"""Review R12-3: the ``hf:`` tokenizer stops early on over-limit prompts and encodes long texts
without the GIL (tenancy/hf_tokenizer.py).

A small byte-level BPE (GPT-2's pre-tokenizer) is trained in process: nothing is downloaded.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenancy.hf_tokenizer import GIL_FREE_CHARS, PROBE_CHARS_PER_TOKEN, PROBE_MARGIN_TOKENS, HuggingFaceTokenizer

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _words(rnd: random.Random, n: int) -> str:
    return " ".join("".join(rnd.choice(LETTERS) for _ in range(rnd.randint(2, 9))) for _ in range(n))


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> HuggingFaceTokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rnd = random.Random(7)
    corpus = [_words(rnd, 60) for _ in range(300)] + ["=" * rnd.randint(1, 48) + " " for _ in range(300)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=1200, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    path = Path(tmp_path_factory.mktemp("hf")) / "tokenizer.json"
    tok.save(str(path))
    return HuggingFaceTokenizer(str(path))


class Spy:
    """Records the length (characters) of every text handed to the wrapped ``tokenizers.Tokenizer``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.encoded: list[int] = []
        self.batched: list[int] = []

    def encode(self, text: str, **kw: Any) -> Any:
        self.encoded.append(len(text))
        return self.inner.encode(text, **kw)

    def encode_batch(self, texts: list[str], **kw: Any) -> Any:
        self.batched.extend(len(t) for t in texts)
        return self.inner.encode_batch(texts, **kw)


def _truth(hf: HuggingFaceTokenizer, text: str) -> list[int]:
    return list(hf._tok.encode(text, add_special_tokens=False).ids)


def test_an_over_limit_prompt_is_encoded_only_up_to_its_probe_slice(hf: HuggingFaceTokenizer, monkeypatch) -> None:
    limit = 2000
    rnd = random.Random(1)
    text = _words(rnd, 40_000)[: hf.max_text_bytes(limit) - 1]  # within the byte bound: the old code encoded it all
    assert len(text) > 4 * PROBE_CHARS_PER_TOKEN * (limit + 1) and len(_truth(hf, text)) > 2 * limit
    spy = Spy(hf._tok)
    monkeypatch.setattr(hf, "_tok", spy)
    assert len(hf.encode(text, limit)) == limit + 1
    probe = PROBE_CHARS_PER_TOKEN * (limit + 1)
    (cut,) = spy.encoded + spy.batched  # one call: the probe slice, cut before a space that ends a word
    assert probe - 4096 <= cut <= probe and text[cut] == " " and text[cut - 1] != " "


def test_a_long_text_is_encoded_through_the_gil_free_call_with_the_same_ids(hf: HuggingFaceTokenizer,
                                                                         monkeypatch) -> None:
    text = _words(random.Random(2), GIL_FREE_CHARS // 4)
    assert len(text) >= GIL_FREE_CHARS
    want = _truth(hf, text)
    short = text[: text.index(" ", 100)]
    want_short = _truth(hf, short)
    spy = Spy(hf._tok)
    monkeypatch.setattr(hf, "_tok", spy)
    assert hf.encode(text) == want and spy.batched == [len(text)] and spy.encoded == []
    assert hf.encode(short) == want_short and spy.encoded == [len(short)]


def test_a_sparse_text_under_the_limit_is_accepted_whole(hf: HuggingFaceTokenizer) -> None:
    """Few tokens per character (long ``=`` runs): the probe slice is under the limit, so the whole
    text is encoded and its exact ids come back (never refused for its length alone)."""
    text = " ".join("=" * 48 for _ in range(400))
    n = len(_truth(hf, text))
    limit = n + 1
    assert len(text) > PROBE_CHARS_PER_TOKEN * (limit + 1)  # the probe runs, and must not refuse
    assert hf.encode(text, limit) == _truth(hf, text)


TEXT = st.lists(st.sampled_from(["ab", "cde", " ", "  ", "=", "==========", "\n", "é", "x1"]),
                max_size=400).map(lambda parts: "".join(parts) * 8)


@settings(max_examples=150, deadline=None)
@given(text=TEXT, limit=st.integers(0, 300))
def test_early_stop_never_changes_the_verdict_or_an_accepted_prompts_ids(hf: HuggingFaceTokenizer, text: str,
                                                                        limit: int) -> None:
    truth = _truth(hf, text)
    got = hf.encode(text, limit)
    if len(truth) <= limit:
        assert got == truth
    else:
        assert len(got) == limit + 1


def test_the_margin_covers_a_cut_inside_one_long_word(hf: HuggingFaceTokenizer) -> None:
    """No whitespace near the probe length: the slice ends inside a word, so "over" needs the
    margin; a text just over the limit is still told apart exactly."""
    rnd = random.Random(3)
    word = "".join(rnd.choice(LETTERS) for _ in range(20_000))
    n = len(_truth(hf, word))
    for limit in (n - 1, n, n - PROBE_MARGIN_TOKENS - 1, max(0, n // PROBE_CHARS_PER_TOKEN)):
        got = hf.encode(word, limit)
        assert (got == _truth(hf, word)) if n <= limit else (len(got) == limit + 1)
