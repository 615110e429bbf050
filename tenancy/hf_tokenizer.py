"""The HuggingFace ``tokenizer.json`` adapter, with bounded work for over-limit prompts.

Review R12-3 (session 12): the adapter refused unencoded only above its byte bound,
``limit`` x the longest vocabulary entry's UTF-8 length. Real byte-level vocabularies hold
entries of ~128 bytes, so at ``max_prompt_tokens`` 8192 that bound (~1 MB) is above the
1 MiB body cap and every over-limit prompt was encoded whole (~0.6 s of event-loop CPU for
1 MiB on the CI machine) before its 400. Two changes, each with its test
(tests/tenancy/test_s12_hf_tokenizer.py):

* **Early stop by a probe slice.** A text longer than :data:`PROBE_CHARS_PER_TOKEN` x
  (``limit`` + 1) characters is first encoded up to a whitespace boundary near that length.
  Tokenizers used in front of LLMs pre-split text at whitespace (GPT-2/Llama-3 byte-level
  regexes, SentencePiece's Metaspace, BERT's Whitespace): no token spans such a boundary, so
  the slice's tokens are the whole text's first tokens and a slice of more than ``limit``
  tokens proves "over" at a cost of O(limit) characters. To stay right for a tokenizer that
  does not split there (the tokens at the cut may then differ), "over" needs
  :data:`PROBE_MARGIN_TOKENS` more than the limit; otherwise the whole text is encoded, as
  before, so an accepted prompt's ids never come from a slice.
* **A second probe sized by the first (session 13, R12-3's residual).** A sparse text (few tokens per
  character: long runs of ``=``, one long word) holds fewer than ``limit`` tokens in the first slice
  even when the whole text is far over, and was then encoded whole (1 MiB of ``=``: ~0.9 s of thread
  CPU with the tests' BPE; byte-pair merging in one huge pre-token costs more per character the longer
  it is: 300 ns/char at 16 kB, 850 ns/char at 1 MiB). The first slice's density (its tokens per
  character) now sizes a second slice expected to hold :data:`PROBE_GROWTH` x (``limit`` +
  :data:`PROBE_MARGIN_TOKENS` + 1) tokens; it is encoded when it is shorter than the text, and more
  than ``limit`` + :data:`PROBE_MARGIN_TOKENS` tokens there prove "over" as for the first slice. So a
  text of even density is refused after encoding about 1.25x the characters that hold the limit,
  whatever its length; a text whose density falls after the first slice (made to defeat the
  estimate) costs that second slice, shorter than the text, on top of the whole encode as before.
  Measured: /work/notes/s13-fixes.md.
  The cut is at a whitespace boundary when there is one near the length, else inside a word (the margin
  covers its changed tail, as for the first slice).
* **Large encodes release the GIL.** ``Tokenizer.encode_batch`` runs without the GIL
  (``encode`` holds it), so a text of at least :data:`GIL_FREE_CHARS` characters is encoded
  through it: a caller that runs this on a worker thread (gateway/admission.py,
  ``tokenize_off_loop``) keeps the event loop serving other tenants meanwhile.

Sources: the ``tokenizers`` Python API (``Tokenizer.encode``, ``encode_batch``,
``get_vocab``); GPT-2's pre-tokenizer pattern (Radford et al. 2019, ``encoder.py``).
"""

from __future__ import annotations

from tenancy.tokenizer_base import MIN_MESSAGE_BYTES, TokenizerError

__all__ = ["HuggingFaceTokenizer", "PROBE_CHARS_PER_TOKEN", "PROBE_MARGIN_TOKENS", "PROBE_GROWTH", "GIL_FREE_CHARS"]

#: the probe slice holds about this many characters per token of ``limit + 1`` (English prose
#: averages ~4 characters per token; a text that holds fewer tokens per character is encoded whole)
PROBE_CHARS_PER_TOKEN = 8
#: tokens above the limit a probe slice must hold to prove "over" (covers a tokenizer whose
#: tokens at the cut differ from the whole text's: the cut changes only its last piece)
PROBE_MARGIN_TOKENS = 64
#: the second probe slice is sized to hold this many times the tokens that prove "over", at the first's density
PROBE_GROWTH = 1.25
#: texts of at least this many characters are encoded through ``encode_batch`` (GIL released)
GIL_FREE_CHARS = 16 * 1024
#: how far back from the probe length to look for a whitespace boundary, in characters
_BOUNDARY_WINDOW = 4096


class HuggingFaceTokenizer:
    """Adapter for a local HuggingFace ``tokenizer.json`` (package ``tokenizers``).

    ``max_token_bytes``: the UTF-8 length of the longest vocabulary entry. Raises
    :class:`tenancy.tokenizer_base.TokenizerError` if the file cannot be loaded. Nothing is
    downloaded: only a local path is accepted. ``releases_gil``: a long text's encode runs
    without the GIL (:data:`GIL_FREE_CHARS`), so callers may run it on a worker thread.
    """

    releases_gil = True

    def __init__(self, path: str) -> None:
        try:
            from tokenizers import Tokenizer as _HfTokenizer
        except ImportError as exc:  # pragma: no cover - dependency is declared
            raise TokenizerError("package 'tokenizers' is not installed") from exc
        try:
            self._tok = _HfTokenizer.from_file(path)
        except Exception as exc:
            raise TokenizerError(f"cannot load tokenizer file {path!r}: {exc}") from exc
        self.name = f"hf:{path}"
        vocab = self._tok.get_vocab(with_added_tokens=True)
        #: UTF-8 length of the longest vocabulary entry (an over-estimate of the bytes one
        #: token covers: byte-level BPE spells a byte as one, sometimes two-byte, character)
        self.max_token_bytes = max((len(t.encode("utf-8", "surrogatepass")) for t in vocab), default=1) or 1

    def _ids(self, text: str) -> list[int]:
        """The ids of ``text``; a long text through ``encode_batch`` (the GIL released)."""
        if len(text) >= GIL_FREE_CHARS:
            return list(self._tok.encode_batch([text], add_special_tokens=False)[0].ids)
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def encode(self, text: str, limit: int | None = None) -> list[int]:
        """Return the model's token ids for ``text`` (no special tokens added).

        With ``limit`` (>= 0), a result of ``limit + 1`` ids means "more than ``limit``
        tokens" (its ids are then unspecified); otherwise the result is the whole text's ids.
        A text larger than :meth:`max_text_bytes` of ``limit`` is not encoded at all; a text
        longer than :data:`PROBE_CHARS_PER_TOKEN` x (``limit + 1``) characters whose probe
        slice holds more than ``limit`` + :data:`PROBE_MARGIN_TOKENS` tokens is not encoded
        further, nor one whose second slice (sized by the first's density, shorter than the text)
        does (module docstring: R12-3 and its residual).
        """
        if limit is None:
            return self._ids(text)
        limit = max(0, limit)
        over = [0] * (limit + 1)
        if len(text.encode("utf-8", "surrogatepass")) > self.max_text_bytes(limit):
            return over
        probe = PROBE_CHARS_PER_TOKEN * (limit + 1)
        if len(text) > probe:
            proof = limit + PROBE_MARGIN_TOKENS  # more tokens than this in a slice: "over"
            cut = _whitespace_boundary(text, probe)
            found = len(self._ids(text[:cut]))
            if found > proof:
                return over
            # R12-3's residual: a sparse text; a second slice sized by the first one's density
            second = int(cut * PROBE_GROWTH * (proof + 1) / max(1, found))
            if second < len(text):
                cut = _whitespace_boundary(text, second)
                if len(self._ids(text[:cut])) > proof:
                    return over
        return self._ids(text)[: limit + 1]

    def max_text_bytes(self, tokens: int) -> int:
        """``tokens`` x the longest vocabulary entry's UTF-8 length.

        A bound for tokenizers that cover every input byte with some token
        (byte-level BPE, SentencePiece with byte fallback). A tokenizer that
        drops text (a whitespace pre-tokenizer) or maps any unknown word to
        one ``[UNK]`` has no byte bound: set ``max_prompt_bytes`` explicitly.
        """
        return max(0, tokens) * self.max_token_bytes

    def max_messages(self, tokens: int) -> int:
        """Messages whose rendering (at least 10 bytes each) fits in :meth:`max_text_bytes`."""
        return max(1, self.max_text_bytes(tokens) // MIN_MESSAGE_BYTES)


def _whitespace_boundary(text: str, end: int) -> int:
    """The index of the last whitespace character that follows a non-whitespace one in
    ``text[end - 4096:end]`` (a pre-tokenizer boundary: the slice before it ends a piece),
    or ``end`` when there is none (one long word: the margin covers its changed tail)."""
    lo = max(1, end - _BOUNDARY_WINDOW)
    for i in range(end - 1, lo - 1, -1):
        if text[i].isspace() and not text[i - 1].isspace():
            return i
    return end
