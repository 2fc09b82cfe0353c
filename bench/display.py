"""How a benchmark's result is shown: a table of one line per measured path and a summary
line, or the result as JSON; with a chart file, also a bar chart of the table's first column.
Each benchmark module says how its table looks in its own `table(result)`."""
from __future__ import annotations

import dataclasses
import json
from typing import Callable, Optional

# A table column: (heading, key in each row's result, format of the value).
Column = tuple[str, str, str]
RATE: Column = ("rows/s", "rows_per_second", "{:,.0f}")
MEDIAN: Column = ("median s", "median_seconds", "{:.2f}")
PROCESS: Column = ("process s", "median_process_seconds", "{:.2f}")


@dataclasses.dataclass(frozen=True)
class Table:
    rows: dict[str, dict]
    columns: list[Column]
    summary: str = ""


def processes_table(result: dict) -> Table:
    """A benchmark of whole processes (bench/processes.py): in-run rate, whole process time
    and the ratio to its baseline."""
    return Table(result["paths"], [RATE, MEDIAN, PROCESS,
                                   (f"vs {result['baseline']}", "vs_baseline", "{:.2f}x")])


def show(result: dict, table: Table, as_json: bool, echo: Callable[..., None],
         plot: Optional[str] = None, title: str = "") -> None:
    """`echo(text, err=False)` prints (click.echo); `plot`: a PNG path for the chart."""
    if plot:
        from bench.chart import bar_chart

        heading, key, _ = table.columns[0]
        bar_chart({name: row[key] for name, row in table.rows.items()}, plot,
                  title=title, ylabel=heading, ratios=key == RATE[1])
        echo(f"Chart: {plot}", err=True)
    if as_json:
        echo(json.dumps(result, indent=2))
        return
    for line in format_table(table):
        echo(line)


def format_table(table: Table) -> list[str]:
    cells = [[name] + [fmt.format(row[key]) for _, key, fmt in table.columns]
             for name, row in table.rows.items()]
    headings = [""] + [heading for heading, _, _ in table.columns]
    widths = [max(len(line[i]) for line in [headings] + cells) for i in range(len(headings))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths))
             for line in [headings] + cells]
    return lines + ([table.summary] if table.summary else [])
