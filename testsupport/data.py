"""Benchmark data made from the bundled taxi sample with a fixed seed, never checked in."""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from components.example_gen.sources.locate import taxi_csv_path

SEED = 20241122


def taxi_like_table(rows: int, seed: int = SEED) -> pa.Table:
    """`rows` trips drawn with replacement from the 15,002 real ones; floats get a small
    multiplicative jitter so rows are not exact copies (compression stays realistic)."""
    source = pacsv.read_csv(taxi_csv_path())
    rng = np.random.default_rng(seed)
    table = source.take(pa.array(rng.integers(0, source.num_rows, rows)))
    columns = []
    for name, column in zip(table.column_names, table.columns):
        if pa.types.is_floating(column.type):
            jitter = pa.array(1.0 + rng.normal(0.0, 0.01, rows))
            column = pc.multiply(column, jitter)
        columns.append(column)
    return pa.Table.from_arrays(columns, table.column_names)


def write_taxi_csv(rows: int, folder: str, seed: int = SEED) -> str:
    """`folder`/data.csv: `taxi_like_table(rows, seed)` with a bare header line, written once
    per (rows, seed). Stock CsvExampleGen splits its header line on commas and keeps quotes in
    the column names, and pyarrow 10's `write_csv` quotes every name (it has no quoting
    option), so the header is written here and pyarrow writes the rows. The stamp sits beside
    the folder, since ExampleGens read every file inside it."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "data.csv")
    stamp = folder.rstrip("/") + ".stamp"
    wanted = f"{rows}:{seed}:bare-header"
    if os.path.exists(path) and os.path.exists(stamp) and open(stamp).read() == wanted:
        return path
    table = taxi_like_table(rows, seed)
    partial = folder.rstrip("/") + ".csv.partial"
    with open(partial, "wb") as out:
        out.write((",".join(table.column_names) + "\n").encode())
        pacsv.write_csv(table, out, pacsv.WriteOptions(include_header=False))
    os.replace(partial, path)
    with open(stamp, "w") as f:
        f.write(wanted)
    return path


def tweets_like(path, rows: int = 6000, seed: int = 7):
    """A table of short posts written by pandas' `to_csv`: text with commas, quotes, emoji
    and line breaks of every kind. CPython before 3.11.9 leaves a cell whose only special
    character is a bare CR unquoted, which no reader can tell from a row's end, so such
    cells here hold a comma too."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    words = ["just", "landed", "in", "Paris,", "France", "\"best\"", "day", "ever!", "RT",
             "@someone:", "#python", "can't", "wait", "😀", "https://t.co/x1", "lol", "—", "ok"]
    breaks = ["\n", "\r\n", "\r,", "\n\n"]
    texts = []
    for _ in range(rows):
        parts = list(rng.choice(words, rng.integers(1, 25)))
        for _ in range(rng.integers(0, 3)):
            parts.insert(rng.integers(0, len(parts) + 1), rng.choice(breaks))
        texts.append(" ".join(parts))
    frame = pd.DataFrame({"id": np.arange(rows), "user": [f"user{i % 97}" for i in range(rows)],
                          "text": texts, "retweets": rng.integers(0, 500, rows),
                          "lang": rng.choice(["en", "fr", "es"], rows),
                          "label": rng.integers(0, 2, rows)})
    frame.to_csv(path, index=False)
    return frame
