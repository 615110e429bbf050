"""R12-4: ``prefixgate serve`` and its helper processes never import PrefixGate's packages from the
working directory.

``serve`` re-executes itself (``policy.reexec_with_go_gc``) and starts the audit worker, the span
exporter and ``--workers`` children with ``python -m``, which used to put the working directory first
on ``sys.path``: a directory there named ``audit`` (``gateway``, ``policy``, ...) ran inside the
gateway, and ``init``'s config directory, which holds ``audit/`` (the log folder), broke every restart
started from inside it under an editable install. The gateway runs here as the console script does
(a script outside the working directory, so the first process is safe and the re-exec is what is
tested), with this tree on ``PYTHONPATH``, or found by an editable-style finder for the restart case.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim.quickstart import init_gateway_dir
from tests.support.serve_cli import ROOT, quickstart_ports, stop, wait_logged

pytestmark = pytest.mark.e2e

PACKAGES = ("audit", "gateway", "policy", "rego", "routing", "sim", "tenancy")

#: what ``pip install .`` writes as bin/prefixgate (the script's directory, not the cwd, is sys.path[0])
CONSOLE_SCRIPT = "import sys\nfrom gateway.cli import main\nsys.exit(main())\n"

#: an editable install's import hook (setuptools' ``__editable__`` finder): PrefixGate's packages are
#: found after the path entries, which is what lets a same-named directory in the cwd shadow them
EDITABLE_FINDER = """\
import importlib.machinery, sys
_ROOT, _NAMES = {root!r}, {names!r}
class _EditableFinder:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return importlib.machinery.PathFinder.find_spec(name, [_ROOT]) if name in _NAMES else None
sys.meta_path.insert(sys.meta_path.index(importlib.machinery.PathFinder) + 1, _EditableFinder)
"""


def _env(pythonpath: str, gogc: str | None = None) -> dict[str, str]:
    """Ours with ``pythonpath``, without PYTHONSAFEPATH, GOGC only when given (unset: ``serve``
    re-executes itself; set: it does not, and starts its helper processes itself)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GOGC", "PYTHONSAFEPATH", "PYTHONPATH")}
    env["PYTHONPATH"] = pythonpath
    if gogc is not None:
        env["GOGC"] = gogc
    return env


def _serve(tmp: Path, config: Path, cwd: Path, env: dict[str, str], name: str) -> tuple[subprocess.Popen[bytes], Path]:
    script = tmp / "bin" / "prefixgate"
    script.parent.mkdir(exist_ok=True)
    script.write_text(CONSOLE_SCRIPT)
    log = tmp / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(script), "serve", "--config", str(config)], cwd=str(cwd),
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    return proc, log


def _run_until_ready(tmp: Path, config: Path, cwd: Path, env: dict[str, str], name: str) -> str:
    """Start ``serve``, wait (bounded) for its ``ready: `` line, stop it; returns its log."""
    proc, log = _serve(tmp, config, cwd, env, name)
    try:
        wait_logged(lambda: "ready: " in log.read_text(), f"{name}: gateway ready", proc, log, timeout_s=90)
    finally:
        stop(proc)
    return log.read_text()


def _plant(directory: Path, marker: Path) -> Path:
    """Write a package for each of PrefixGate's import names into ``directory``, each appending
    its name and pid to ``marker`` when imported; returns ``directory``."""
    for name in PACKAGES:
        (directory / name).mkdir(parents=True)
        (directory / name / "__init__.py").write_text(
            f"import os\nopen({str(marker)!r}, 'a').write(f'{name} pid {{os.getpid()}}\\n')\n")
    return directory


def _init(tmp: Path) -> Path:
    port, admin_port, base = quickstart_ports()
    return init_gateway_dir(tmp / "gw", port=port, admin_port=admin_port, replicas=1,
                            replica_base_port=base).config


@pytest.mark.parametrize("gogc", [None, "800"], ids=["re-exec", "no-re-exec"])
def test_planted_packages_in_the_working_directory_are_never_imported(tmp_path: Path, gogc: str | None) -> None:
    config = _init(tmp_path)
    marker = tmp_path / "PLANTED-IMPORTED"
    planted = _plant(tmp_path / "shared-dir", marker)
    text = _run_until_ready(tmp_path, config, planted, _env(str(ROOT), gogc), "serve-planted")
    assert not marker.exists(), f"planted package imported: {marker.read_text()}\n{text}"


def test_restart_from_the_init_config_directory(tmp_path: Path) -> None:
    config = _init(tmp_path)
    site = tmp_path / "editable-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(EDITABLE_FINDER.format(root=str(ROOT), names=set(PACKAGES)))
    env = _env(str(site))
    _run_until_ready(tmp_path, config, config.parent, env, "serve-first")
    assert (config.parent / "audit").is_dir()  # the log folder now shadows the package name
    _run_until_ready(tmp_path, config, config.parent, env, "serve-restart")


def test_span_exporter_child_ignores_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The span exporter child (``audit.tracing_offload``; off in the quickstart config) likewise."""
    from opentelemetry.sdk.resources import Resource

    from audit.span_export import OffloadSpanProcessor

    marker = tmp_path / "PLANTED-IMPORTED"
    monkeypatch.chdir(_plant(tmp_path / "shared-dir", marker))
    proc = OffloadSpanProcessor("console", Resource.create({"service.name": "pg-r12-4"}))
    proc.start()
    pid = proc.child_pid
    assert pid is not None
    proc.shutdown()  # EOF on its stdin: the child reads its config, then exits; reaped here
    assert not marker.exists(), marker.read_text()
    assert proc.restarts == 0 and proc.dropped == 0


def test_worker_and_demo_child_commands_ignore_the_working_directory(tmp_path: Path) -> None:
    """``serve --workers N`` (gateway/workers.py: :mod:`gateway.child_python`) and the demo and
    benchmark starters (:func:`sim.procs.python_module_cmd` with :func:`sim.procs.start_process`)."""
    from gateway.child_python import child_env, python_module_argv
    from sim.procs import python_module_cmd, start_process, stop_process

    marker = tmp_path / "PLANTED-IMPORTED"
    planted = _plant(tmp_path / "shared-dir", marker)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")}
    done = subprocess.run(python_module_argv("gateway.child_python"), cwd=planted, env=child_env(env),
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    sim_child = start_process("sim-child", python_module_cmd("sim.procs"), tmp_path / "logs", cwd=planted)
    try:
        assert sim_child.popen.wait(timeout=60) == 0, sim_child.log_path.read_text()
    finally:
        stop_process(sim_child)
    assert not marker.exists(), marker.read_text()
