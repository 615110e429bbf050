"""S25-review-4: ``audit verify`` on crafted files reports, it never crashes (after S24-review-3's odd types).

Before: (1) a record holding an integer beyond 64 bits (its ``seq``, or any body value; a writer never writes
one: orjson cannot encode it) raised ``TypeError: Integer exceeds 64-bit range`` from the record hash, and a
checkpoint body holding one (re-signed with the key: a leaked key can sign anything) raised it from the
signature check; (2) a line nested deeper than ``json.loads`` reads raised ``RecursionError`` from the loader,
from ``audit verify DIR`` over ``worker-*`` chains (its instance count) and from the anchors reader. Each was a
traceback and no report. After: the record is ``modified`` / ``bad_signature`` / ``malformed`` at its line,
and ``audit verify`` prints its report with exit 1."""
from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from audit.chain import sign_checkpoint
from audit.cli import audit_group
from audit.jsonl import list_log_files
from audit.verify import verify_files
from tests.audit.test_s23_verify_key_rotation import rotated  # noqa: F401 - the fixture

_DEEP = "[" * 100_000 + "]" * 100_000


def _lines(target: Path) -> list[str]:
    return target.read_text().splitlines(keepends=True)


def _problems(rotated: dict) -> list[tuple[str, int | None]]:  # noqa: F811
    report = verify_files([rotated["dir"]], [rotated["a"].public_key(), rotated["b"].public_key()])
    assert report.status == "FAILED"
    return [(p.kind, p.line) for p in report.problems]


async def test_an_integer_beyond_64_bits_in_an_event_is_modified_not_a_crash(rotated) -> None:  # noqa: F811
    target = list_log_files(rotated["dir"])[1]
    lines = _lines(target)
    i = next(i for i, line in enumerate(lines) if json.loads(line)["type"] == "event")
    rec = json.loads(lines[i])
    rec["body"]["status_code"] = 2**70
    lines[i] = json.dumps(rec) + "\n"
    target.write_text("".join(lines))
    assert ("modified", i + 1) in _problems(rotated)


async def test_a_seq_beyond_64_bits_is_reported_not_a_crash(rotated) -> None:  # noqa: F811
    target = list_log_files(rotated["dir"])[1]
    lines = _lines(target)
    rec = json.loads(lines[-1])
    lines[-1] = json.dumps(dict(rec, seq=2**70)) + "\n"
    target.write_text("".join(lines))
    assert ("modified", len(lines)) in _problems(rotated)


async def test_a_signed_checkpoint_with_a_huge_integer_is_reported_not_a_crash(rotated) -> None:  # noqa: F811
    target = list_log_files(rotated["dir"])[1]
    lines = _lines(target)
    i = max(i for i, line in enumerate(lines) if json.loads(line)["type"] == "checkpoint")
    rec = json.loads(lines[i])
    body = sign_checkpoint(rotated["b"], {k: v for k, v in rec["body"].items() if k != "sig"})
    body["extra"] = 2**70  # after signing: the signature check must encode it
    lines[i] = json.dumps(dict(rec, body=body)) + "\n"
    target.write_text("".join(lines))
    problems = _problems(rotated)
    assert ("modified", i + 1) in problems and ("bad_signature", i + 1) in problems


async def test_a_deeply_nested_line_is_malformed_in_every_verify_path(rotated, tmp_path: Path) -> None:  # noqa: F811
    target = list_log_files(rotated["dir"])[1]
    with target.open("a") as fh:
        fh.write('{"seq": ' + _DEEP + "}\n")
    line = len(_lines(target))
    assert ("malformed", line) in _problems(rotated)
    # a directory with worker-* chains beside its own files: audit/verify_instances.py reads every line too
    worker = rotated["dir"] / "worker-0"
    worker.mkdir()
    (worker / target.name).write_text(target.read_text())
    anchors = tmp_path / "anchors.log"
    anchors.write_text("x " + '{"head_seq": ' + _DEEP + "}\n")
    pubs = ["--public-key", str(rotated["a_pub"]), "--public-key", str(rotated["b_pub"])]
    for args in ([str(rotated["dir"])], [str(worker), "--anchors", str(anchors)]):
        res = CliRunner().invoke(audit_group, ["verify", *pubs, *args])
        assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
        assert res.exit_code == 1 and "nested too deeply" in res.output, res.output[-2000:]
