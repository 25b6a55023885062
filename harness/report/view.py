"""One run's summary as the report's tables read it (labels, columns, cells by key), and the table format they share."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from harness import formatter as fm
from harness.store import shapes


def table(rows: list[list[Any]], headers: list[str]) -> str:
    """A GitHub-flavoured Markdown table, its cells as written (no number parsing)."""
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


class View:
    """One run's summary as the report reads it: labels, columns and cells by key."""

    def __init__(self, summary: shapes.Summary):
        self.s = summary
        self.several_hosts = len(summary["hosts"]) > 1
        self.grid = {(c["host"], c["strategy"], c["task"]): c for c in summary["cells"]}
        self.kinds = {s["id"]: s for s in summary["strategies"]}

    def label(self, host: str, strategy: str) -> str:
        return fm.md(f"{host}: {strategy}" if self.several_hosts else strategy)

    def columns(self, speculative_only: bool = False) -> list[tuple[str, str]]:
        cols = [(h, s["id"]) for h in self.s["hosts"] for s in self.s["strategies"]]
        return [(h, s) for h, s in cols if not speculative_only or self.kinds[s]["baseline"] is not None]

    def cell(self, host: str, strategy: str, task: str) -> shapes.CellSummary | None:
        return self.grid.get((host, strategy, task))
