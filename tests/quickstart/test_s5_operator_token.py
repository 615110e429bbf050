"""R5-10: the README's operator-token block works as written against a quickstart instance.

The block (README section "Put PrefixGate in front of your replicas", the one minting a token for
``spiffe://quickstart.test/ops/admin``) is run with ``bash -e`` from the directory holding the
``init`` directory, on free ports: the init directory name and admin port 8081 are the only
substitutions. ``curl --fail-with-body`` makes a refused token fail the block. Also: ``init``'s
config names the operator token command and the admin audience's default."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.serve_cli import ENV, ROOT, ready_quickstart


def operator_block() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Put PrefixGate in front of your replicas\n", 1)[1].split("\n## ", 1)[0]
    (block,) = [b for b in re.findall(r"```sh\n(.*?)```", section, re.S) if "ops/admin" in b]
    return block


def test_readme_operator_block_reads_the_admin_listener(tmp_path: Path) -> None:
    block = operator_block()
    assert "--aud prefixgate-admin" in block and "8081" in block and "mygw" in block
    with ready_quickstart(tmp_path) as run:
        script = block.replace("mygw", "gw").replace("8081", str(run.admin_port))
        env = {**ENV, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{ENV.get('PATH', '')}"}
        done = subprocess.run(["bash", "-e", "-c", script], cwd=str(tmp_path), env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        replicas = json.loads(done.stdout)["replicas"]
        assert [r["id"] for r in replicas] == ["replica-0"]


def test_init_config_names_the_operator_token_and_admin_audience(tmp_path: Path) -> None:
    from sim.quickstart import init_gateway_dir

    res = init_gateway_dir(tmp_path / "gw", port=1, admin_port=2, replica_base_port=3)
    text = res.config.read_text()
    assert "spiffe://quickstart.test/ops/admin --aud prefixgate-admin" in text
    assert "identity.admin_audience, default prefixgate-admin" in text
