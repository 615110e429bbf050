"""docs/architecture.md cannot rot (issue 11): every module and function its tables name exists,
every source path it names exists, every ``Class.method`` it names is defined, and the request
flow lists the pipeline's steps in the order gateway/pipeline.py calls them.

Read from the source with :mod:`ast` (nothing is imported)."""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("gateway", "routing", "tenancy", "policy", "audit")

_TICKED = re.compile(r"`([^`]+)`")
_PATH = re.compile(r"^[a-z_]+/[\w/]*\.py$")
_QUALNAME = re.compile(r"^[A-Z]\w*\.[A-Za-z_]\w*$")
_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)?$")


@functools.cache
def _defined(path: str) -> dict[str, set[str]]:
    """Top-level names of ``path`` -> the names defined in their body (methods, properties,
    class attributes); a function's entry is empty."""
    tree = ast.parse((ROOT / path).read_text())
    out: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = set()
        elif isinstance(node, ast.ClassDef):
            members: set[str] = set()
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    members.add(sub.name)
                elif isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name):
                    members.add(sub.target.id)
            out[node.name] = members
        elif isinstance(node, ast.Assign):
            out.update({t.id: set() for t in node.targets if isinstance(t, ast.Name)})
    return out


def missing_in_module(path: str, name: str) -> str | None:
    """Why ``name`` (``func``, ``Class`` or ``Class.member``) is not defined in ``path``, else None."""
    if not (ROOT / path).is_file():
        return f"{path}: no such module"
    top, _, member = name.partition(".")
    defs = _defined(path)
    if top not in defs:
        return f"{path}: no {top}"
    if member and member not in defs[top]:
        return f"{path}: {top} has no {member}"
    return None


def table_rows(text: str) -> list[tuple[str, list[str]]]:
    """(module, names) of every row of every table whose header has ``module`` and ``function``."""
    rows: list[tuple[str, list[str]]] = []
    cols: list[str] | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            cols = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cols is None:
            cols = [c.lower() for c in cells]
            continue
        if set(cells) <= {"---", ""} or "module" not in cols or "function" not in cols:
            continue
        module = _TICKED.findall(cells[cols.index("module")])
        names = _TICKED.findall(cells[cols.index("function")])
        assert len(module) == 1 and _PATH.match(module[0]), f"one module path per row: {line}"
        assert names and all(_NAME.match(n) for n in names), f"function names per row: {line}"
        rows.append((module[0], names))
    return rows


def prose(text: str) -> str:
    """``text`` without its fenced code blocks (their backticks would pair with the prose's)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _check_tables(text: str) -> list[str]:
    return [why for module, names in table_rows(text) for n in names if (why := missing_in_module(module, n))]


def test_every_table_row_names_an_existing_module_and_function() -> None:
    rows = table_rows(DOC.read_text())
    assert len(rows) >= 25  # the request flow and the shared-state table
    assert _check_tables(DOC.read_text()) == []


def test_the_check_catches_a_name_that_does_not_exist() -> None:
    doc = ("| step | module | function |\n|---|---|---|\n"
           "| a | `gateway/pipeline.py` | `InferencePipeline.handle`, `InferencePipeline.no_such_step` |\n"
           "| b | `gateway/nowhere.py` | `f` |\n")
    assert _check_tables(doc) == ["gateway/pipeline.py: InferencePipeline has no no_such_step",
                                  "gateway/nowhere.py: no such module"]


def test_every_path_named_exists() -> None:
    text = DOC.read_text()
    paths = {p for p in _TICKED.findall(prose(text)) if _PATH.match(p)}
    for m in re.finditer(r"\b([a-z_]+/[a-z_]+/)\{([a-z_,\s]+)\}\.py", text):  # routing/filters/{a,b}.py
        paths |= {f"{m.group(1)}{name.strip()}.py" for name in m.group(2).split(",")}
    assert len(paths) > 40
    assert sorted(p for p in paths if not (ROOT / p).is_file()) == []


def test_every_class_member_named_is_defined() -> None:
    """``Class.member`` anywhere on the page is defined by a class of that name in the packages."""
    classes: dict[str, set[str]] = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            for name, members in _defined(str(f.relative_to(ROOT))).items():
                classes.setdefault(name, set()).update(members)
    named = {n.removesuffix("()") for n in _TICKED.findall(prose(DOC.read_text()))}
    bad = []
    for qual in sorted(n for n in named if _QUALNAME.match(n)):
        cls, member = qual.split(".")
        if cls not in classes or member not in classes[cls]:
            bad.append(qual)
    assert bad == []


def test_the_flow_lists_the_steps_in_the_order_the_pipeline_calls_them() -> None:
    """The steps issue 11 and the flow control added, in the table and in gateway/pipeline.py alike."""
    order = ["OverloadGuard.shed", "Authenticator.authenticate", "Admission.resolve_tenant",
             "FlowControl.check_queue_room", "Admission.admit", "PolicyEnforcementPoint.decide",
             "FlowControl.release", "Router.route", "open_upstream", "Held.release", "Recorder.record"]
    flow = [n for _, names in table_rows(DOC.read_text()) for n in names]
    assert [n for n in flow if n in order] == order
    src = (ROOT / "gateway" / "pipeline.py").read_text()
    # session 15: the pipeline sheds (then enters) with OverloadGuard.shed_or_enter, one call; session 16: it
    # authenticates, admits and decides with the *_now forms (a cache hit, the in-process limiter: no coroutine)
    calls = {"OverloadGuard.shed": ".overload.shed_or_enter(", "Authenticator.authenticate": ".authn.authenticate_now(",
             "Admission.resolve_tenant": ".resolve_tenant(", "FlowControl.check_queue_room": ".check_queue_room(",
             "Admission.admit": "adm.admit_now(", "PolicyEnforcementPoint.decide": ".pep.decide_now(",
             "FlowControl.release": ".flow.release(", "Router.route": ".router.route(",
             "open_upstream": "open_upstream(gw", "Held.release": "held.release()",
             "Recorder.record": ".recorder.record("}
    at = [src.index(calls[n]) for n in order]
    assert at == sorted(at), dict(zip(order, at))
