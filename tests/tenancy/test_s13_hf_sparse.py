"""R12-3's residual (session 13): with an ``hf:`` tokenizer, a sparse over-limit text (few tokens per
character: long ``=`` runs, one long word) was encoded whole before its refusal, because the first
probe slice held fewer than ``limit`` tokens. A second slice sized by the first one's density now
proves "over" after bounded work (tenancy/hf_tokenizer.py); the verdict and accepted ids never change.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenancy.hf_tokenizer import PROBE_CHARS_PER_TOKEN, PROBE_MARGIN_TOKENS, HuggingFaceTokenizer

LETTERS = "abcdefghijklmnopqrstuvwxyz"


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> HuggingFaceTokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rnd = random.Random(7)
    words = [" ".join("".join(rnd.choice(LETTERS) for _ in range(rnd.randint(2, 9))) for _ in range(60))
             for _ in range(300)]
    corpus = words + ["=" * rnd.randint(1, 48) + " " for _ in range(300)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=1200, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    path = Path(tmp_path_factory.mktemp("hf13")) / "tokenizer.json"
    tok.save(str(path))
    return HuggingFaceTokenizer(str(path))


class Spy:
    """Records the length (characters) of every text handed to the wrapped ``tokenizers.Tokenizer``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.lengths: list[int] = []

    def encode(self, text: str, **kw: Any) -> Any:
        self.lengths.append(len(text))
        return self.inner.encode(text, **kw)

    def encode_batch(self, texts: list[str], **kw: Any) -> Any:
        self.lengths.extend(len(t) for t in texts)
        return self.inner.encode_batch(texts, **kw)


def _truth(hf: HuggingFaceTokenizer, text: str) -> list[int]:
    return list(hf._tok.encode_batch([text], add_special_tokens=False)[0].ids)


def test_a_sparse_over_limit_text_is_refused_without_encoding_it_whole(hf: HuggingFaceTokenizer,
                                                                      monkeypatch: Any) -> None:
    text = "=" * 200_000  # one pre-token: no whitespace boundary anywhere
    n = len(_truth(hf, text))
    limit = -(-len(text) // hf.max_token_bytes)  # the smallest limit whose byte bound lets it be encoded
    assert len(text.encode()) <= hf.max_text_bytes(limit) and n > limit + PROBE_MARGIN_TOKENS
    assert len(text) > PROBE_CHARS_PER_TOKEN * (limit + 1)  # the first probe runs, and cannot prove "over"
    spy = Spy(hf._tok)
    monkeypatch.setattr(hf, "_tok", spy)
    assert len(hf.encode(text, limit)) == limit + 1
    # before: the first slice, then the whole text (200,000 characters); now a second slice of about
    # 1.25x the characters that hold limit + margin tokens at the text's density, not the text
    need = (limit + PROBE_MARGIN_TOKENS + 1) * len(text) / n
    assert len(spy.lengths) == 2 and spy.lengths[1] < len(text), spy.lengths
    assert spy.lengths[1] <= 1.3 * need, (spy.lengths, need)


def test_a_text_whose_density_falls_after_the_first_slice_is_still_told_apart(hf: HuggingFaceTokenizer) -> None:
    """Dense words first, then a long ``=`` run: the second slice's estimate is too short, the whole
    text is encoded, the verdict is exact (the bounded-work claim is for texts of even density)."""
    rnd = random.Random(5)
    head = " ".join("".join(rnd.choice(LETTERS) for _ in range(rnd.randint(2, 9))) for _ in range(1_500))
    text = head + " " + "=" * 60_000
    n = len(_truth(hf, text))
    for limit in (n - 1, n, n // 2, n - PROBE_MARGIN_TOKENS - 1):
        got = hf.encode(text, limit)
        assert (got == _truth(hf, text)) if n <= limit else (len(got) == limit + 1)


PARTS = st.sampled_from(["=" * 48, "=" * 47, "=" * 300, " ", "ab", "x1 ", "é", "\n", "cde "])
TEXT = st.lists(PARTS, min_size=1, max_size=120).map(lambda p: "".join(p) * 6)


@settings(max_examples=150, deadline=None)
@given(text=TEXT, limit=st.integers(0, 600))
def test_the_second_probe_never_changes_the_verdict_or_an_accepted_prompts_ids(hf: HuggingFaceTokenizer,
                                                                              text: str, limit: int) -> None:
    truth = _truth(hf, text)
    got = hf.encode(text, limit)
    if len(truth) <= limit:
        assert got == truth
    else:
        assert len(got) == limit + 1
