"""R12-D6: a finding id that has more than one row in docs/security.md (reported open, fixed in a
later session; or a residual row added later) points from each earlier row to a later one, so that
whoever greps an id and reads the first hit does not take a stale status for the current one."""
from __future__ import annotations

import pathlib
import re
from collections import defaultdict

REPO = pathlib.Path(__file__).resolve().parents[2]
#: a finding id opening a table row: R10b-4, S9-L4, S4-small-3, R3-1 (then maybe "(left)", "rest", ...)
ROW_ID = re.compile(r"^\| ([A-Z][A-Za-z]*\d+[a-z]?(?:-[A-Za-z0-9]+)+)\b[^|]*\|")


def rows_by_id(text: str) -> dict[str, list[tuple[int, str]]]:
    """``{finding id: [(line number, row text), ...]}`` in document order."""
    found: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for n, line in enumerate(text.splitlines(), 1):
        m = ROW_ID.match(line)
        if m:
            found[m.group(1)].append((n, line))
    return found


def test_every_earlier_row_of_a_repeated_id_points_below() -> None:
    rows = rows_by_id((REPO / "docs" / "security.md").read_text(encoding="utf-8"))
    repeated = {k: v for k, v in rows.items() if len(v) > 1}
    assert repeated, "the check found no repeated id: has the table format changed?"
    stale = [f"{rid} (line {n})" for rid, hits in repeated.items() for n, line in hits[:-1] if "below" not in line]
    assert not stale, f"rows without a pointer to the later row of the same id: {stale}"


def test_the_id_pattern_reads_the_ids_of_the_review_example() -> None:
    text = "| R10b-4 | x | open | — |\n| A row | y |\n| R10b-4 | x | **fixed** | t |\n| S9-L4 residual | z |\n"
    assert {k: len(v) for k, v in rows_by_id(text).items()} == {"R10b-4": 2, "S9-L4": 1}
