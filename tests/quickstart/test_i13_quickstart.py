"""Issue 13, "done when": a new operator's first five minutes, from a fresh wheel install.

1. Build the wheel from a copy of the source tree (``pip wheel --no-deps
   --no-build-isolation``: no downloads) and check the shipped policy is in it.
2. Make a virtual environment with ``--system-site-packages`` and install the
   wheel with ``--no-deps``. The README's install block (``pip install .`` and
   the OPA bindings) is replaced by this offline equivalent: the running
   interpreter's dependencies (the OPA bindings included) are made visible to
   the new environment through a ``.pth`` file listing a directory of links to
   them, PrefixGate itself excluded, so only the wheel's copy can be imported.
3. In an unrelated empty directory, run the README section "Put PrefixGate in
   front of your replicas" word for word (its second code block, parsed from
   README.md) with the environment's ``bin`` first on ``PATH``: ``init``,
   start the replicas, ``serve``, mint a token for tenant ``acme`` (named in
   the config ``init`` wrote), ``/v1/models``, one plain and one streamed
   chat completion; every ``curl -f`` must see a 2xx.
4. Against the still-running gateway, for each tenant of that config:
   ``/v1/models`` equals the tenant's entitlement in the config, and a plain
   and a streamed request answer 200. The gateway's ready line names the
   installed policy directory (inside the environment, not the source tree).

The README block uses fixed ports (8080, 8081, 8101, 8102); the test fails
early, saying so, if one is taken.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import site
import socket
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[2]
PORTS = (8080, 8081, 8101, 8102)
#: Top-level entries of the source tree the wheel does not need (nested names such as rego/data stay).
TOP_LEVEL_SKIP = {".git", ".venv", "venv", "build", "dist", "tests", "data", "bench", "results", ".hypothesis",
                  ".pytest_cache", "examples", "docs"}


def _copy_ignore(directory: str, names: list[str]) -> set[str]:
    skip = {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}
    if Path(directory) == ROOT:
        skip |= TOP_LEVEL_SKIP & set(names)
    return skip


def readme_block(title: str, index: int) -> str:
    """The ``index``-th ```sh block of the README section ``## title``."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, re.S)[index]


def _port_free(port: int) -> bool:
    """True when a server could listen on ``port`` now: bound as uvicorn and aiohttp bind (``SO_REUSEADDR``),
    so a connection of an earlier run left in TIME_WAIT does not count, a listener does."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _dependency_dir(tmp: Path) -> Path:
    """A directory of symlinks to the running interpreter's installed packages, PrefixGate excluded."""
    deps = tmp / "deps"
    deps.mkdir()
    ours = {"gateway", "tenancy", "policy", "audit", "sim", "rego"}
    for sp in site.getsitepackages():
        if not Path(sp).is_dir():  # Debian's CPython lists <prefix>/local/lib/python3.X/dist-packages, made on use
            continue
        for entry in Path(sp).iterdir():
            name = entry.name
            if name in ours or name.startswith(("prefixgate", "__editable__", "_prefixgate")) or name.endswith(".pth"):
                continue
            if not (deps / name).exists():
                (deps / name).symlink_to(entry)
    return deps


def _wheel(tmp: Path) -> Path:
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=_copy_ignore)
    dist = tmp / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "-q", "-w", str(dist), str(src)], check=True, timeout=600, cwd=str(tmp))
    (whl,) = dist.glob("prefixgate-*.whl")
    names = set(zipfile.ZipFile(whl).namelist())
    assert {"rego/authz.rego", "rego/authz_test.rego", "rego/__init__.py",
            "rego/data/prefixgate/config/tiers.json", "rego/data/prefixgate/config/pools.json",
            "rego/data/prefixgate/config/workloads.json"} <= names, sorted(n for n in names if n.startswith("rego"))
    assert not any("tenants.json" in n for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    eps = zipfile.ZipFile(whl).read(entry_points).decode()
    assert "prefixgate = gateway.cli:main" in eps and "prefixgate-sim = sim.cli:main" in eps
    return whl


def _venv(tmp: Path, whl: Path) -> Path:
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                   check=True, timeout=120)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "_i13_dependencies.pth").write_text(str(_dependency_dir(tmp)) + "\n")
    env = _clean_env(venv)
    subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(whl)],
                   check=True, timeout=300, env=env, cwd=str(tmp))
    return venv


def _clean_env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "GOGC")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    return env


def _token(venv: Path, env: dict[str, str], cwd: Path, spiffe_id: str) -> str:
    return subprocess.run([str(venv / "bin" / "prefixgate-sim"), "token", "mygw", spiffe_id], check=True,
                          capture_output=True, text=True, env=env, cwd=str(cwd), timeout=60).stdout.strip()


def test_readme_quickstart_from_a_fresh_wheel_install(tmp_path: Path) -> None:
    taken = [p for p in PORTS if not _port_free(p)]
    assert not taken, f"the README quickstart needs ports {PORTS} free on 127.0.0.1; taken: {taken}"
    assert sysconfig.get_paths()["purelib"]  # a normal interpreter layout
    whl = _wheel(tmp_path)
    venv = _venv(tmp_path, whl)
    env = _clean_env(venv)
    work = tmp_path / "somewhere-else"
    work.mkdir()
    # the installed package, not the source tree, is what runs
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import gateway, rego; print(gateway.__file__); "
                            "print(rego.policy_dir())"], check=True, capture_output=True, text=True, env=env,
                           cwd=str(work)).stdout.split()
    assert all(str(venv) in w for w in where), where

    block = readme_block("Put PrefixGate in front of your replicas", 1)
    out = tmp_path / "readme.out"
    with open(out, "wb") as fh:
        shell = subprocess.Popen(["bash", "-e", "-c", block], cwd=str(work), env=env, stdout=fh,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert shell.wait(timeout=240) == 0, out.read_text()
        text = out.read_text()
        assert '{"status":"ready"}' in text
        assert '{"object":"list","data":[{"id":"sim-model","object":"model"' in text, text
        assert '"object": "chat.completion"' in text or '"object":"chat.completion"' in text, text
        assert "data: [DONE]" in text and '"chat.completion.chunk"' in text, text
        ready = re.search(r"ready: policy embedded \(dir (.+?)\), 2 tenants, 1 trust domains, 2 replicas", text)
        assert ready, text
        assert ready.group(1).startswith(str(venv)), ready.group(1)

        # every tenant of the config init wrote: /v1/models is its entitlement; plain and streamed 200
        cfg = yaml.safe_load((work / "mygw" / "gateway.yaml").read_text())
        assert [t["id"] for t in cfg["tenancy"]["tenants"]] == ["acme", "globex"]
        with httpx.Client(base_url="http://127.0.0.1:8080", timeout=60) as client:
            for t in cfg["tenancy"]["tenants"]:
                sid = t["spiffe_ids"][0] + "worker"
                h = {"Authorization": f"Bearer {_token(venv, env, work, sid)}"}
                models = client.get("/v1/models", headers=h)
                assert models.status_code == 200, models.text
                assert [m["id"] for m in models.json()["data"]] == sorted(set(t["models"]) & set(cfg["models"]))
                body = {"model": t["models"][0], "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
                plain = client.post("/v1/chat/completions", headers=h, json=body)
                assert plain.status_code == 200 and plain.json()["choices"], plain.text
                with client.stream("POST", "/v1/chat/completions", headers=h, json={**body, "stream": True}) as s:
                    assert s.status_code == 200
                    chunks = [ln for ln in s.iter_lines() if ln.startswith("data: ")]
                assert chunks[-1] == "data: [DONE]" and json.loads(chunks[0][6:])["choices"]
    finally:
        try:
            os.killpg(shell.pid, signal.SIGTERM)  # the README's background jobs share the shell's group
        except ProcessLookupError:
            pass
        # wait for the gateway's last line and for every listener to be gone (session 30, flake30): the public
        # port is free ~0.14 s before "stopped: audit flushed, exiting" is written, so a wait for free ports
        # alone could read the output too early; it only did not because the replicas' connections left in
        # TIME_WAIT kept a plain bind failing for the whole 60 s bound, every run
        def stopped() -> bool:
            text = out.read_text()
            ended = "stopped: audit flushed, exiting" in text or "listening: public" not in text  # never started
            return ended and all(_port_free(p) for p in PORTS)

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not stopped():
            time.sleep(0.1)
    text = out.read_text()
    assert "draining: listeners closed" in text and "stopped: audit flushed, exiting" in text, text
