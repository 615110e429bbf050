"""Compile the hot path's modules with Cython, unchanged, into an export of the tree (bench-only, not a test).

``python -m bench.cython_build --into /tmp/s23-cy [--modules bench/cython_modules.txt] [--skip PATH ...]``

Issue 14, session 23 (docs/benchmarks.md "Session 23: compiled"). Cython's pure-Python mode: each listed
``.py`` file is translated to C as it is (no ``.pxd``, no source change) and built into an extension module
(``name.cpython-311-x86_64-linux-gnu.so``) beside its source in ``--into``; the import system prefers the
extension over the ``.py`` (ExtensionFileLoader comes before SourceFileLoader), so the export runs
compiled where a ``.so`` exists and pure elsewhere. ``--into`` must be a scratch export
(``git archive HEAD | tar -x -C DIR``), never the working tree: the product does not depend on the build.

Needs Cython and setuptools in the interpreter that runs this script, and a C compiler with the
interpreter's headers (Debian: ``gcc``, ``python3.11-dev``). The built modules work only with the same
CPython (version and ABI) as the one that built them: run it with a venv made from the gateway's
interpreter (e.g. ``/usr/bin/python3.11 -m venv /tmp/cyvenv && /tmp/cyvenv/bin/pip install cython
setuptools click``). Each module is translated and compiled on its own, so one that Cython refuses is
reported and left pure instead of failing the build. Directives: ``language_level=3``, ``binding=True``
(functions keep ``__signature__``-style introspection), and ``annotation_typing=False`` unless
``--annotation-typing``: with it Cython enforces annotations such as ``x: int`` or ``x: float`` as C types
at run time, which changes behaviour where an annotation is looser than the values passed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click

HERE = Path(__file__).resolve().parent
MODULES = HERE / "cython_modules.txt"


def module_list(path: Path) -> list[str]:
    """The ``.py`` paths (relative to the tree's root) listed in ``path``: one a line, ``#`` comments."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line)
    return out


def _setup_script(rel: str, annotation_typing: bool) -> str:
    """A setup.py body that builds the one extension module of ``rel`` in place."""
    name = rel[:-3].replace("/", ".")
    directives = {"language_level": 3, "binding": True, "annotation_typing": annotation_typing,
                  "embedsignature": False}
    return ("from setuptools import setup\nfrom setuptools.extension import Extension\n"
            "from Cython.Build import cythonize\n"
            f"setup(name='cy', script_args=['build_ext', '--inplace', '-q'], ext_modules=cythonize("
            f"[Extension({name!r}, [{rel!r}])], quiet=True, compiler_directives={directives!r}))\n")


def build_one(tree: Path, rel: str, annotation_typing: bool) -> dict[str, object]:
    """Translate and compile ``tree/rel``; returns ``{"module", "ok", "seconds", "error"}`` (error: last lines)."""
    t = time.monotonic()
    work = tree / ".cython-build" / rel.replace("/", "_")
    work.mkdir(parents=True, exist_ok=True)
    script = work / "setup.py"
    script.write_text(_setup_script(rel, annotation_typing), encoding="utf-8")
    env = {**os.environ, "CFLAGS": os.environ.get("CFLAGS", "-O2")}
    proc = subprocess.run([sys.executable, str(script)], cwd=tree, env=env, capture_output=True, text=True,
                          check=False)
    ok = proc.returncode == 0 and any((tree / rel).parent.glob(Path(rel).stem + ".*.so"))
    err = "" if ok else "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
    (tree / rel).with_suffix(".c").unlink(missing_ok=True)
    return {"module": rel, "ok": ok, "seconds": round(time.monotonic() - t, 1), "error": err}


def build(tree: Path, modules: Sequence[str], jobs: int, annotation_typing: bool) -> list[dict[str, object]]:
    """Build every module of ``modules`` under ``tree`` (``jobs`` at a time); one result per module."""
    missing = [m for m in modules if not (tree / m).is_file()]
    if missing:
        raise click.UsageError(f"not in {tree}: {missing}")
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(lambda m: build_one(tree, m, annotation_typing), modules))
    shutil.rmtree(tree / ".cython-build", ignore_errors=True)
    shutil.rmtree(tree / "build", ignore_errors=True)
    return results


@click.command(help=__doc__.splitlines()[0] if __doc__ else None)
@click.option("--into", "tree", required=True, type=click.Path(path_type=Path, file_okay=False, exists=True),
              help="A scratch export of the tree (never the working tree).")
@click.option("--modules", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=MODULES,
              show_default=True, help="The list of .py files to compile.")
@click.option("--skip", multiple=True, help="A listed module to leave pure (repeatable).")
@click.option("--jobs", type=int, default=2, show_default=True)
@click.option("--annotation-typing/--no-annotation-typing", default=False, show_default=True)
@click.option("--clean", is_flag=True, help="Remove the export's extension modules and stop (back to pure).")
def main(tree: Path, modules: Path, skip: Sequence[str], jobs: int, annotation_typing: bool, clean: bool) -> None:
    """Entry point (module doc)."""
    tree = tree.resolve()
    if (tree / ".git").exists():
        raise click.UsageError(f"{tree} is a git working tree; build into a scratch export")
    if clean:
        for so in tree.rglob("*.so"):
            so.unlink()
        return
    names = [m for m in module_list(modules) if m not in set(skip)]
    results = build(tree, names, jobs, annotation_typing)
    failed = [r for r in results if not r["ok"]]
    (tree / "cython_build.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    click.echo(f"compiled {len(results) - len(failed)} of {len(results)} modules into {tree}")
    for r in failed:
        click.echo(f"FAILED {r['module']}:\n{r['error']}", err=True)


if __name__ == "__main__":
    main()
