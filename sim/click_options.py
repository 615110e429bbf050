"""Script options parsed with click into a namespace (issue 11: one CLI library).

The ``python -m sim.*`` and ``python -m bench.*`` scripts declare their options as
``click.Option`` objects through :class:`ClickOptions` and get back a
``types.SimpleNamespace`` whose attribute names are click's parameter names
(``--time-scale`` -> ``time_scale``), so their ``run(args)`` functions read ``args.x``
as before. Parsing, ``--help`` and usage errors are click's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import click


class ClickOptions:
    """The options of one script, parsed by a ``click.Command`` built from them.

    ``prog`` is the name shown in usage lines (default: click's guess from ``sys.argv``);
    ``description`` is the command's help text; ``show_default``: ``--help`` shows every
    option's default (click's ``show_default`` context setting).
    """

    def __init__(self, prog: str | None = None, description: str | None = None, *,
                 show_default: bool = False) -> None:
        self.prog = prog
        self.description = description
        self.show_default = show_default
        self.params: list[click.Parameter] = []

    def option(self, *decls: str, **attrs: Any) -> None:
        """Add one ``click.Option(decls, **attrs)`` (e.g. ``is_flag=True``, ``hidden=True``)."""
        self.params.append(click.Option(list(decls), **attrs))

    def parse(self, argv: Sequence[str] | None = None) -> SimpleNamespace:
        """Parse ``argv`` (default ``sys.argv[1:]``) into a namespace of option values.

        Values of ``multiple=True`` options are lists. ``-h``/``--help`` prints the help (as argparse did) and raises
        ``SystemExit(0)``; a usage error prints click's message and raises ``SystemExit(2)``.
        """
        def callback(**values: Any) -> SimpleNamespace:
            return SimpleNamespace(**{k: list(v) if isinstance(v, tuple) and self._multiple(k) else v
                                      for k, v in values.items()})

        command = click.Command(name=self.prog, params=self.params, callback=callback,
                                help=self.description, context_settings={"max_content_width": 100,
                                                  "help_option_names": ["-h", "--help"],
                                                  "show_default": self.show_default})
        try:
            result = command.main(args=None if argv is None else list(argv), prog_name=self.prog,
                                  standalone_mode=False)
        except click.ClickException as exc:
            exc.show()
            raise SystemExit(exc.exit_code) from None
        except click.exceptions.Abort:
            raise SystemExit(1) from None
        if not isinstance(result, SimpleNamespace):  # --help: click returns the exit code
            raise SystemExit(result or 0)
        return result

    def _multiple(self, name: str) -> bool:
        return any(isinstance(p, click.Option) and p.multiple and p.name == name for p in self.params)
