"""``prefixgate audit`` commands (click): ``verify`` and ``keygen``.

The lead mounts :data:`audit_group` into the main CLI
(``main.add_command(audit_group)``); ``python -m audit.cli`` works alone.
"""
from __future__ import annotations

import os
import sys

import click

from audit.keys import KeyFileError, generate_signing_key
from audit.verify import verify_files
from audit.verify_anchors import load_anchors
from audit.verify_instances import (
    chain_groups,
    format_instances_report,
    verify_instances,
)
from audit.verify_keys import load_key_ring
from audit.verify_report import format_report

#: ``audit verify`` exit status when no problem was found but event records
#: follow the last checkpoint that an ``--anchors`` copy confirms
EXIT_UNANCHORED = 3


@click.group("audit")
def audit_group() -> None:
    """Audit trail tools."""


@audit_group.command("verify")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--public-key", "public_keys", required=True, multiple=True, type=click.Path(exists=True),
              help="Ed25519 public key (PEM), or a directory of *.pub files; repeatable: across a signing-key "
                   "rotation give the old and the new key, each checkpoint is checked with the key of its key_id")
@click.option("--partial", is_flag=True, help="first file need not start the chain")
@click.option("--anchors", "anchors", multiple=True, type=click.Path(),
              help="file (or directory of files) written by another sink holding checkpoint copies: the OCSF "
                   "file, a syslog receiver's file (CEF or OCSF payload), an OTLP JSON export; repeatable")
def verify_cmd(paths: tuple[str, ...], public_keys: tuple[str, ...], partial: bool, anchors: tuple[str, ...]) -> None:
    """Verify hash chain and checkpoint signatures of audit FILES/DIRS.

    Several instances' chains at once: each directory given is one chain, and
    each of its subdirectories with log files (``worker-*/``) one more, even
    beside log files of its own (S24-newcomer-3: none is skipped), plain files
    together are one chain; each chain is verified on its own, its events must name one
    instance, no two chains the same; a combined line ends the report
    (audit/verify_instances.py). ``--anchors`` needs a single chain.

    Several ``--public-key`` (files or directories of ``*.pub``): each checkpoint is checked
    with the key of the ``key_id`` it names; a checkpoint whose key id no given key has is
    ``unknown_key`` (exit 1, naming the id); a key id given twice is a usage error (exit 2),
    never a silent choice (S23-newcomer-4). A checkpoint of a key that a file header retired
    (a key rotation recorded by the sink) is ``retired_key`` (exit 1; session 24, S23-fixverify-1).

    Exit 0: OK; 1: a problem (modified, missing, reordered, truncated per an
    anchor, bad signature, retired key, instance mismatch); 2: usage; 3 (with --anchors): no
    problem, but event records follow the last externally anchored checkpoint
    (reported as unanchored).
    """
    try:
        ring = load_key_ring(public_keys)
    except KeyFileError as exc:
        raise click.BadParameter(str(exc), param_hint="--public-key") from None
    groups = chain_groups(paths)
    if len(groups) > 1:
        if anchors:
            names = ", ".join(label for label, _ in groups)
            raise click.UsageError(f"--anchors checks one chain, the paths hold {len(groups)} ({names}): "
                                   f"give one instance's directory or files")
        result = verify_instances(paths, ring, require_genesis=not partial)
        click.echo(format_instances_report(result))
        sys.exit({"OK": 0, "UNANCHORED": EXIT_UNANCHORED}.get(result.status, 1))
    found = None
    problems = []
    if anchors:
        found, problems = load_anchors(anchors)
    report = verify_files(groups[0][1], ring, require_genesis=not partial, anchors=found)
    report.problems.extend(problems)
    click.echo(format_report(report))
    sys.exit({"OK": 0, "UNANCHORED": EXIT_UNANCHORED}.get(report.status, 1))


@audit_group.command("keygen")
@click.argument("private_key_file", type=click.Path())
@click.option("--public-key-file", type=click.Path(), default=None)
def keygen_cmd(private_key_file: str, public_key_file: str | None) -> None:
    """Create an Ed25519 checkpoint signing key (private mode 0600, public .pub). Never overwrites
    a private or a public key file (S21-fixnew-1); exit 1 with a one-line error when a file cannot be
    created (S21-newcomer-1)."""
    try:
        generate_signing_key(private_key_file, public_key_file)
    except OSError as exc:
        raise click.ClickException(keygen_problem(exc, private_key_file)) from None
    click.echo(f"wrote {private_key_file} and {public_key_file or private_key_file + '.pub'}")



def keygen_problem(exc: OSError, private_key_file: str) -> str:
    """The one-line error of ``audit keygen`` for ``exc`` (raised creating a key file; its ``filename``
    names the file): what is wrong and what to do. Session 21, S21-newcomer-1 (was a traceback)."""
    path = exc.filename or private_key_file
    if isinstance(exc, FileExistsError) and os.path.abspath(path) != os.path.abspath(private_key_file):
        return (f"{path} already exists: a signing key is never overwritten (a public key may verify the logs "
                f"an old key signed); choose another path, or --public-key-file")  # S21-fixnew-1 (session 22)
    if isinstance(exc, FileExistsError):
        return (f"{path} already exists: a signing key is never overwritten; choose another path, or move the "
                f"old key away first (keep its .pub to verify the logs it signed)")
    if isinstance(exc, FileNotFoundError):
        directory = os.path.dirname(os.path.abspath(path))
        return (f"cannot create {path}: the directory {directory} does not exist; create it "
                f"(e.g. install -d -m 0700 {directory}) or choose another path")
    return f"cannot create {path}: {exc.strerror or exc}"


if __name__ == "__main__":
    audit_group()
