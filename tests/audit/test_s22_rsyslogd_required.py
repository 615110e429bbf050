"""Session 22, S21-newcomer-9: the syslog tests follow the shared-state tests' rule. Without ``rsyslogd``
they skip on a developer machine and fail under ``CI`` (before, their ``skipif`` skipped them either
way), by the one helper :func:`tests.support.system_deps.require_system_binary`; and ``.ci/run``
exports ``CI=true`` itself (before, the rule depended on the runner setting it)."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import rsyslog_helper  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODULES = ["tests/audit/test_syslog_rsyslog.py", "tests/audit/test_i10_cef_rsyslog_restart.py",
           "tests/audit_e2e/test_e2e_outcomes.py", "tests/audit_e2e/test_e2e_spill.py"]


def test_missing_rsyslogd_fails_under_ci_and_skips_without(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(rsyslog_helper, "RSYSLOGD", str(tmp_path / "no-rsyslogd"))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI is set, so the syslog tests may not be skipped"):
        rsyslog_helper.require_rsyslogd()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="rsyslogd is not installed"):
        rsyslog_helper.require_rsyslogd()
    present = tmp_path / "rsyslogd"
    present.touch()
    monkeypatch.setattr(rsyslog_helper, "RSYSLOGD", str(present))
    assert rsyslog_helper.require_rsyslogd() == str(present)


@pytest.mark.parametrize("module", MODULES)
def test_every_rsyslogd_module_uses_the_rule(module: str) -> None:
    text = (ROOT / module).read_text(encoding="utf-8")
    assert 'pytestmark = pytest.mark.usefixtures("rsyslogd_binary")' in text
    assert "skipif" not in text  # no second rule beside the fixture


def test_no_test_module_skips_on_a_missing_system_binary_by_itself() -> None:
    # the rule lives in tests/support/system_deps.py; a module starting rsyslogd uses the fixture
    for path in (ROOT / "tests").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if "Rsyslog(" in text and path.name.startswith("test_"):
            assert 'usefixtures("rsyslogd_binary")' in text, path
        assert not re.search(r"skipif\([^)]*(RSYSLOGD|REDIS_SERVER|rsyslogd|redis-server)", text), path


def test_ci_entry_point_exports_ci_before_the_tests() -> None:
    lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert "export CI=true" in lines and "make test" in lines
    assert lines.index("export CI=true") < lines.index("make test")
