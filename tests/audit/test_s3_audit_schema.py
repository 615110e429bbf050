"""The ``audit`` section's pydantic schema (audit/config_schema.py, issue 11 item 4): unknown keys
and wrong types are refused at config load with the dotted path, every key loads and builds,
and the schema's keys are exactly the keys of docs/configuration.md's audit table."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from audit.config import AuditConfigError, build_audit
from audit.config_schema import AuditSection, section_keys
from audit.keys import generate_signing_key
from gateway.config import ConfigError, GatewayConfig, load_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _load(tmp_path: Path, audit: Any) -> GatewayConfig:
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump({"audit": audit}), encoding="utf-8")
    return load_config(path)


def _refused(tmp_path: Path, audit: Any) -> str:
    with pytest.raises(ConfigError) as ei:
        _load(tmp_path, audit)
    return str(ei.value)


def _full(tmp_path: Path) -> dict[str, Any]:
    """A section that sets every key (the sinks point nowhere: it is only built, never started)."""
    key = tmp_path / "keys" / "audit.key"
    key.parent.mkdir()
    generate_signing_key(key)
    return {
        "worker": "inline",
        "jsonl": {"dir": str(tmp_path / "jsonl"), "signing_key_file": str(key), "rotate_bytes": 1 << 20,
                  "rotate_s": 600, "checkpoint_s": 5},
        "ocsf": {"file": str(tmp_path / "ocsf.jsonl")},
        "syslog": {"host": "127.0.0.1", "port": 6514, "protocol": "tcp", "format": "ocsf", "ca_file": None,
                   "max_message_bytes": 2048},
        "otlp": {"endpoint": "http://127.0.0.1:4318/v1/logs", "headers": {"Authorization": "x"}, "timeout_s": 2,
                 "compression": "gzip", "ca_file": None},
        "spill": {"dir": str(tmp_path / "spill"), "max_bytes": 1 << 20},
        "summary": {"window_s": 5, "first_n": 3, "max_sources": 100},
        "instance": "host/w1",
        "slow_send_s": 0.5,
        "concentration": {"window_s": 3.0, "share_threshold": 0.6, "index_threshold": 0.5, "hold_s": 2.0,
                          "clear_ratio": 0.8, "hit_drop_ratio": 0.5, "min_requests": 20, "baseline_windows": 10,
                          "pools": {"default": ["r1", "r2"]}, "significance_z": 3.0},
    }


@pytest.mark.parametrize("audit, where", [
    ({"sylog": {"host": "h", "port": 1}}, "audit.sylog: unknown field"),
    ({"syslog": {"host": "h", "port": 1, "prot": "tcp"}}, "audit.syslog.prot: unknown field"),
    ({"jsonl": {"dir": "/a", "signing_key_file": "/k", "rotate_byte": 5}}, "audit.jsonl.rotate_byte:"),
    ({"otlp": {"endpoint": "http://c:4318/v1/logs", "header": {}}}, "audit.otlp.header:"),
    ({"spill": {"dir": "/s", "max_byte": 1}}, "audit.spill.max_byte:"),
    ({"ocsf": {"path": "/o"}}, "audit.ocsf.path:"),
    ({"summary": {"window": 1}}, "audit.summary.window: unknown field"),
    ({"concentration": {"hold": 1}}, "audit.concentration.hold:"),
])
def test_an_unknown_key_is_refused_at_load_with_its_dotted_path(tmp_path: Path, audit: Any, where: str) -> None:
    msg = _refused(tmp_path, audit)
    assert msg.startswith("invalid configuration: ") and where in msg, msg


@pytest.mark.parametrize("audit, where", [
    ({"syslog": {"host": "h", "port": "many"}}, "audit.syslog.port:"),
    ({"syslog": {"host": "h", "port": 70000}}, "audit.syslog.port:"),
    ({"syslog": {"host": "h", "port": 1, "protocol": "sctp"}}, "audit.syslog.protocol:"),
    ({"syslog": {"host": "h", "port": 1, "format": "leef"}}, "audit.syslog.format:"),
    ({"syslog": {"host": "h", "port": 1, "max_message_bytes": 100}}, "audit.syslog.max_message_bytes:"),
    ({"syslog": {"port": 1}}, "audit.syslog.host: Field required"),
    ({"jsonl": {"dir": "/a"}}, "audit.jsonl.signing_key_file: Field required"),
    ({"jsonl": {"dir": "/a", "signing_key_file": "/k", "rotate_s": 0}}, "audit.jsonl.rotate_s:"),
    ({"otlp": {"endpoint": "http://c/v1/logs", "headers": ["Authorization: x"]}}, "audit.otlp.headers:"),
    ({"otlp": {"endpoint": "http://c/v1/logs", "timeout_s": -1}}, "audit.otlp.timeout_s:"),
    ({"otlp": {"endpoint": "http://c/v1/logs", "compression": "zstd"}}, "audit.otlp.compression:"),
    ({"spill": {"max_bytes": 5}}, "audit.spill.dir: Field required"),
    ({"spill": {"dir": "/s", "max_bytes": 0}}, "audit.spill.max_bytes:"),
    ({"summary": True}, "audit.summary: must be a mapping or false"),
    ({"summary": "off"}, "audit.summary: must be a mapping or false"),
    ({"summary": {"window_s": 0}}, "audit.summary.window_s:"),
    ({"summary": {"first_n": -1}}, "audit.summary.first_n:"),
    ({"slow_send_s": 0}, "audit.slow_send_s: Input should be greater than 0"),
    ({"slow_send_s": "soon"}, "audit.slow_send_s:"),
    ({"instance": ""}, "audit.instance:"),
    ({"instance": "x" * 129}, "audit.instance:"),
    ({"worker": "thread"}, "audit.worker:"),
    ({"concentration": {"clear_ratio": 1.5}}, "audit.concentration.clear_ratio:"),
    ({"concentration": {"pools": ["r1"]}}, "audit.concentration.pools:"),
    (["jsonl"], "audit:"),
])
def test_a_wrong_type_or_value_is_refused_at_load(tmp_path: Path, audit: Any, where: str) -> None:
    msg = _refused(tmp_path, audit)
    assert msg.startswith("invalid configuration: ") and where in msg, msg
    assert "SummarySection" not in msg and "literal" not in msg.lower(), msg  # no union member names


def test_a_dict_caller_of_build_audit_gets_the_same_dotted_message(tmp_path: Path) -> None:
    with pytest.raises(AuditConfigError, match=r"^audit\.syslog\.prot: unknown field$"):
        build_audit({"syslog": {"host": "h", "port": 1, "prot": "tcp"}, "spill": {"dir": str(tmp_path)}})


def test_summary_false_and_null_keep_their_meaning(tmp_path: Path) -> None:
    assert _load(tmp_path, {"summary": False}).audit.summary is False
    assert _load(tmp_path, {"summary": None}).audit.summary.window_s == 10  # null: the defaults (on)
    assert _load(tmp_path, {}).audit.summary.first_n == 5


async def test_every_key_loads_builds_and_reaches_the_worker_unchanged(tmp_path: Path) -> None:
    from gateway.auditing import AuditHub

    section = _full(tmp_path)
    cfg = _load(tmp_path, section)
    assert cfg.audit.model_dump(exclude_unset=True) == section
    assert build_audit(section, validate_only=True) is None
    alog = build_audit(cfg.audit)
    assert alog is not None and alog.instance == "host/w1"
    assert [w.sink.name for w in alog._workers] == ["jsonl", "ocsf", "syslog", "otlp"]  # noqa: SLF001
    hub = AuditHub.from_config({**section, "spill": {"dir": str(tmp_path / "spill2")}})  # own spill lock
    assert hub.monitor.hold_s == 2.0 and hub.monitor.share_threshold == 0.6
    assert cfg.audit.worker_section() == {k: v for k, v in section.items() if k not in ("worker", "concentration")}


def test_unset_keys_stay_unset_for_the_worker(tmp_path: Path) -> None:
    """The worker child gets what the file set (not every default): its config line is small
    and a default changed in the code applies without rewriting anyone's file."""
    cfg = _load(tmp_path, {"jsonl": {"dir": "/a", "signing_key_file": "/k"}, "spill": {"dir": "/s"}})
    assert cfg.audit.worker_section() == {"jsonl": {"dir": "/a", "signing_key_file": "/k"}, "spill": {"dir": "/s"}}
    assert _load(tmp_path, {}).audit.worker_section() == {}


def test_an_environment_override_reaches_a_nested_audit_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFIXGATE__AUDIT__SLOW_SEND_S", "0.25")
    assert _load(tmp_path, {"spill": {"dir": "/s"}}).audit.slow_send_s == 0.25


def _documented_keys() -> set[str]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("\n## `audit`", 1)[1].split("\n## ", 1)[0]
    return {m.group(1) for m in re.finditer(r"^\| `([a-z_.]+)` \|", section, re.MULTILINE)}


def test_the_schema_keys_are_the_documented_keys() -> None:
    keys = section_keys(AuditSection)
    assert {"syslog", "syslog.max_message_bytes", "summary.max_sources", "concentration.pools", "worker"} <= keys
    assert keys == _documented_keys()


def test_the_key_check_would_catch_an_undocumented_key() -> None:
    from pydantic import create_model

    grown = create_model("Grown", __base__=AuditSection, linger_s=(float, 0.02))
    assert section_keys(grown) - _documented_keys() == {"linger_s"}
