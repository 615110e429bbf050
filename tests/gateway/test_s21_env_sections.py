"""Session 21, S21-newcomer-4: an environment override whose SECTION is not a top-level key
(``PREFIXGATE__LIMTS__MAX_BODY_BYTES``) was ignored silently by ``serve`` and ``config check``
(pydantic-settings reads only known top-level keys) while a misspelt field inside a known section
is an error. Now both are errors; the message names the variable and the known sections."""
from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gateway.cli import main
from gateway.config import ConfigError, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gateway.yaml"


@pytest.mark.parametrize("name", ["PREFIXGATE__LIMTS__MAX_BODY_BYTES", "PREFIXGATE__LISTN__PORT",
                                  "prefixgate__limts__max_body_bytes", "PREFIXGATE__LIMTS"])
def test_an_unknown_section_is_an_error(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "10")
    with pytest.raises(ConfigError) as err:  # before: loaded, the variable unread
        load_config(None)
    msg = str(err.value)
    assert f"environment variable {name}: unknown section" in msg
    assert "known: admin, audit," in msg and "limits, listen," in msg and "10" not in msg.split("known")[0]


def test_config_check_reports_it(tmp_path: Path) -> None:
    env = {"PREFIXGATE__LIMTS__MAX_BODY_BYTES": "10", "PREFIXGATE__TENANCY__STATE_FILE": str(tmp_path / "ks.json")}
    res = CliRunner().invoke(main, ["config", "check", "--config", str(EXAMPLE)], env=env)
    assert res.exit_code == 1, res.output
    assert "environment variable PREFIXGATE__LIMTS__MAX_BODY_BYTES: unknown section 'limts'" in res.output


def test_known_sections_and_other_prefixgate_variables_are_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFIXGATE__LIMITS__MAX_BODY_BYTES", "4096")
    monkeypatch.setenv("PREFIXGATE__MODELS", '["m1"]')  # a top-level key that is not a section
    monkeypatch.setenv("PREFIXGATE_MASTER_SECRET", "x" * 64)  # one underscore: not an override
    monkeypatch.setenv("PREFIXGATE_LISTEN_FDS", "3,4")
    cfg = load_config(None)
    assert cfg.limits.max_body_bytes == 4096 and cfg.models == ["m1"]
    monkeypatch.setenv("PREFIXGATE__LIMITS__MAX_BODY_BYTE", "10")  # a field typo: an error as before
    with pytest.raises(ConfigError, match="limits.max_body_byte"):
        load_config(None)
