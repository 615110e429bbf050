"""Review R3-13: ``prefixgate serve`` logs ``ready:`` after the trust bundle's first
load (before the fix it came first, while ``/readyz`` still had to load the bundle).
Real CLI in a subprocess in front of ``prefixgate-sim replicas``, ephemeral ports only.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.serve_cli import ready_quickstart


def test_ready_is_logged_after_the_first_trust_bundle_load(tmp_path: Path) -> None:
    # nothing asks /readyz or sends a request: serve itself must load the bundle before "ready:"
    with ready_quickstart(tmp_path) as run:
        text = run.glog.read_text()
        assert "bundle keys now" in text, text
        assert text.index("listening: public") < text.index("bundle keys now") < text.index("ready: "), text
        assert text.index("listening: admin") < text.index("ready: "), text
