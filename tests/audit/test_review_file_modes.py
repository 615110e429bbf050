"""Review finding: audit JSONL files were created world-readable (0644); they hold SPIFFE
IDs, tenant ids and client addresses. Audit, OCSF and spill files are now created 0640
(owner and group only; the umask can narrow it further)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.jsonl import JsonlChainSink
from audit.ocsf import OcsfFileSink
from audit.spill import SpillFile


def _others_bits(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode) & 0o007


async def test_audit_ocsf_and_spill_files_are_not_world_readable(tmp_path: Path) -> None:
    old = os.umask(0o022)  # the usual umask, under which open(..., "a") made 0644 files
    try:
        chain = JsonlChainSink(tmp_path / "chain", Ed25519PrivateKey.generate())
        await chain.open()
        ocsf = OcsfFileSink(str(tmp_path / "ocsf" / "events.jsonl"))
        (tmp_path / "ocsf").mkdir()
        await ocsf.open()
        spill = SpillFile(tmp_path / "spill" / "s.jsonl")
    finally:
        os.umask(old)
    files = [p for p in (tmp_path / "chain").glob("audit-*")] + [tmp_path / "ocsf" / "events.jsonl",
                                                                  tmp_path / "spill" / "s.jsonl"]
    assert len(files) == 3, files
    assert all(_others_bits(p) == 0 for p in files), {str(p): oct(p.stat().st_mode) for p in files}
    for closer in (chain.close, ocsf.close):
        result = closer()
        if hasattr(result, "__await__"):
            await result
    spill.close()
