"""Unit tests of gateway.proxy.BodyDecoder (issue 10, finding 5): incremental decoding of
gzip / deflate replica answers, and refusal of what cannot be decoded."""

from __future__ import annotations

import gzip
import zlib

import pytest

from gateway.proxy import BodyDecoder, ContentCodingError, decode_body

DATA = b'{"choices": [{"text": "' + b"hello world " * 500 + b'"}]}'


def _raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-15)
    return c.compress(data) + c.flush()


@pytest.mark.parametrize("coding,encoded", [
    (None, DATA), ("identity", DATA), ("gzip", gzip.compress(DATA)), ("x-gzip", gzip.compress(DATA)),
    ("GZIP", gzip.compress(DATA)), ("deflate", zlib.compress(DATA)), ("deflate", _raw_deflate(DATA)),
])
def test_decodes_byte_by_byte(coding, encoded):
    dec = BodyDecoder(coding)
    out = b"".join(dec.feed(encoded[i:i + 1]) for i in range(len(encoded))) + dec.finish()
    assert out == DATA
    assert decode_body(encoded, coding) == DATA


@pytest.mark.parametrize("coding", ["br", "zstd", "compress", "gzip, gzip", "gzip, br"])
def test_unknown_or_stacked_codings_refused(coding):
    with pytest.raises(ContentCodingError):
        BodyDecoder(coding)


@pytest.mark.parametrize("coding,encoded", [
    ("gzip", gzip.compress(DATA)[:-10]), ("deflate", zlib.compress(DATA)[:-6]), ("deflate", b"x"),
])
def test_truncated_body_refused(coding, encoded):
    with pytest.raises(ContentCodingError):
        decode_body(encoded, coding)


def test_corrupt_body_refused():
    with pytest.raises(ContentCodingError):
        decode_body(b"\x1f\x8b\x08\x00garbage-garbage-garbage", "gzip")


def test_decoded_size_is_bounded():
    bomb = gzip.compress(b"\0" * (8 << 20))  # ~8 KB on the wire
    dec = BodyDecoder("gzip", max_bytes=1 << 20)
    with pytest.raises(ContentCodingError):
        dec.feed(bomb)
