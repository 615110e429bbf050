"""The ``e2e``, ``slow`` and ``statistical`` markers, applied at collection.

Registered in ``pyproject.toml``; ``tests/conftest.py`` imports
:func:`pytest_collection_modifyitems` so it runs for the whole suite. A plain
``python -m pytest`` (``make test``, the README's command) still runs every
marker; ``-m "not slow"`` or ``-m "not e2e and not statistical"`` select less.

* ``e2e``: the test starts servers or processes: it uses a fixture that does
  (a gateway stack, simulated replicas, an OPA stand-in, rsyslogd, a
  collector), or its module starts them itself (``subprocess``, an aiohttp
  site, the audit worker or span exporter child, rsyslogd, ``tests.support.serve_cli``'s
  ``ready_quickstart``).
* ``slow``: measured above ~3 s on a 2-core machine (listed in :data:`SLOW`,
  from ``--durations``); ``PREFIXGATE_AUDIT_OUTAGE_S`` style runs are slow too.
* ``statistical``: a timing probe that compares samples (modules in
  :data:`STATISTICAL`).
"""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

#: Fixtures that start servers or processes.
E2E_FIXTURES = frozenset({
    "stack", "sim", "raw", "capture", "opa", "opa_server", "fresh_opa_server", "remote_opa", "make_cluster",
    "collector", "serve", "rsyslog", "redis_server",
})
#: Source fragments of modules that start servers or processes themselves.
E2E_SOURCE = ("subprocess", "TCPSite(", "Rsyslog(", "RemoteAuditLog(", "OffloadSpanProcessor(", "start_process(",
              "start_cluster(", "uvicorn.Server", "asyncio.start_server(", "create_subprocess_exec",
              "ready_quickstart(")
#: Modules of timing-probe tests (sample comparisons).
STATISTICAL = frozenset({"tests/security/test_timing_probe.py"})
#: Tests measured above ~3 s (``path::name`` without parameters; a whole module as ``path``).
SLOW: frozenset[str] = frozenset({
    "tests/security/test_timing_probe.py::test_cross_tenant_timing_probe",  # ~23 s
    "tests/soak/test_soak_smoke.py::test_soak_smoke_no_5xx_no_lost_audit_record_fds_recover",  # ~18 s
    "tests/audit_e2e/test_e2e_concentration.py",  # 4-11 s per test
    "tests/soak/test_graceful_shutdown.py::test_sigterm_drains_streams_and_seals_audit",  # ~7 s
    "tests/audit/test_i10_slow_sink.py::test_slow_collector_does_not_stall_the_trail_and_every_event_arrives",
    "tests/replay/test_bounds.py::test_reproduces_issue_figures_on_real_trace",  # ~6 s
    "tests/hostile/test_property.py::test_gateway_never_500_and_forwards_only_schema_valid_bodies",  # ~4 s
    "tests/audit/test_fast_paths.py::test_scrub_event_matches_reference",  # ~4 s
    "tests/audit/test_syslog_rsyslog.py::test_receiver_killed_under_load_no_event_lost",  # 3.4 s; 60 s outage run
    "tests/policy/test_remote_failures.py::test_opa_slower_than_deadline_fails_fast",  # ~3 s
    "tests/hygiene/test_i11_markers.py",  # four collections of the suite, ~30 s
    "tests/scaleout/test_s2_shared_admission.py",  # 3 gateways + redis restarts, 1-5 s per test
    "tests/scaleout/test_s2_workers.py",  # serve --workers 2 as processes, ~10 s
    "tests/security/test_s11_keys_cli_running_gateway.py",  # a real serve process, ~14 s
})

_ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def _module_starts_processes(path: str) -> bool:
    try:
        text = Path(path).read_text("utf-8")
    except OSError:
        return False
    return any(s in text for s in E2E_SOURCE)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Add ``e2e`` / ``slow`` / ``statistical`` to the collected tests (see module doc)."""
    for item in items:
        path = Path(str(item.fspath))
        try:
            rel = path.resolve().relative_to(_ROOT).as_posix()
        except ValueError:
            rel = path.as_posix()
        name = item.name.split("[", 1)[0]
        if E2E_FIXTURES.intersection(getattr(item, "fixturenames", ())) or _module_starts_processes(str(path)):
            item.add_marker(pytest.mark.e2e)
        if rel in SLOW or f"{rel}::{name}" in SLOW:
            item.add_marker(pytest.mark.slow)
        if rel in STATISTICAL:
            item.add_marker(pytest.mark.statistical)
