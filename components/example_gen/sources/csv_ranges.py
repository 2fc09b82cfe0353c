"""Byte ranges of one large plain CSV file, so that several workers read it together.

A range is cut at any byte and holds the records that begin inside it. Where a record begins
depends on the quotes before it, since a line break inside a quoted cell ends no record. In
RFC 4180 CSV a quote inside a quoted cell is written twice, so a line feed ends a record
exactly when the number of quote characters before it in the file is even. The quotes a
range holds (`survey`, which any worker can take) are thus all a range must know of the
bytes before it, and neighbouring ranges agree on the record boundary between them.

That rule holds only where every quote sits where RFC 4180 puts one: a quote that opens a
cell (an even count before it) follows a delimiter, a line break or another quote, and one
that closes a cell is followed by one. A file with any other quote (`5'10"` unquoted, or a
space before an opening quote) is read whole, as Arrow's parser alone knows what it means
there (`layout`).
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Optional

import numpy as np

from components.example_gen.sources.base import SourceRange, compression, open_input

_QUOTE, _LINE_FEED = ord('"'), ord("\n")
# What may stand beside a quote that opens or closes a cell (besides the file's start or end),
# as a table by byte value.
_CELL_EDGE = np.zeros(256, bool)
_CELL_EDGE[[ord(","), ord("\n"), ord("\r"), _QUOTE]] = True
_SCAN_BYTES = 8 << 20


@dataclasses.dataclass(frozen=True)
class RangeSurvey:
    """The quotes of one range, and whether each sits where RFC 4180 puts one, for either
    quote state at the range's start (an even or an odd count of quotes before it)."""

    quotes: int
    regular_from_even: bool
    regular_from_odd: bool


def cut(path: str, size: int, piece_bytes: int) -> list[SourceRange]:
    """`path` (of `size` bytes) in ranges of `piece_bytes`, or none for a file no larger or
    compressed (its records cannot be found from the middle of the stream)."""
    if compression(path) or size <= piece_bytes:
        return []
    return [SourceRange(path, start, min(start + piece_bytes, size), size)
            for start in range(0, size, piece_bytes)]


def survey(source: SourceRange) -> RangeSurvey:
    """The quotes in `source`'s bytes and where they sit, read in blocks."""
    quotes = 0
    regular = [True, True]  # from an even, an odd count before the range
    with open_input(source.path, seekable=True) as stream:
        for offset in range(source.start, source.end, _SCAN_BYTES):
            # One byte either side, to see what stands beside a quote at a block's edge.
            before = max(offset - 1, 0)
            after = min(offset + _SCAN_BYTES, source.end) + 1
            stream.seek(before)
            data = np.frombuffer(stream.read(after - before), np.uint8)
            inner = offset - before
            last = min(offset + _SCAN_BYTES, source.end) - before
            positions = np.flatnonzero(data[inner:last] == _QUOTE) + inner
            if len(positions):
                # Every other quote opens a cell, from the first or the second, by the state.
                even, odd = positions[0::2], positions[1::2]
                fits = {(kind, which): check(data, found, before, source.size)
                        for which, found in (("even", even), ("odd", odd))
                        for kind, check in (("open", _opens_a_cell), ("close", _closes_a_cell))}
                for state in (0, 1):
                    first, second = ("even", "odd") if (quotes + state) % 2 == 0 \
                        else ("odd", "even")
                    regular[state] &= fits[("open", first)] and fits[("close", second)]
            quotes += len(positions)
    return RangeSurvey(quotes, *regular)


def _opens_a_cell(data: np.ndarray, positions: np.ndarray, data_start: int, _: int) -> bool:
    """Whether each quote at `positions` of `data` follows a cell edge or starts the file."""
    before = data[np.maximum(positions - 1, 0)]
    return bool((_CELL_EDGE[before] | (positions + data_start == 0)).all())


def _closes_a_cell(data: np.ndarray, positions: np.ndarray, data_start: int, size: int
                   ) -> bool:
    """Whether each quote at `positions` of `data` is followed by a cell edge or ends the
    file."""
    after = data[np.minimum(positions + 1, len(data) - 1)]
    return bool((_CELL_EDGE[after] | (positions + data_start == size - 1)).all())


def layout(surveys: Iterable[tuple[SourceRange, RangeSurvey]]) -> dict:
    """{(path, start): (quotes before the range, quotes before its end)} for each range of a
    file whose quotes all sit where RFC 4180 puts one, from every range's survey; a range of
    any other file maps to None."""
    by_file: dict[str, list] = {}
    for source, found in surveys:
        by_file.setdefault(source.path, []).append((source, found))
    placed: dict = {}
    for path, ranges in by_file.items():
        seen, regular, counts = 0, True, {}
        for source, found in sorted(ranges, key=lambda r: r[0].start):
            regular &= found.regular_from_odd if seen % 2 else found.regular_from_even
            counts[(path, source.start)] = (seen, seen + found.quotes)
            seen += found.quotes
        placed.update(counts if regular else dict.fromkeys(counts))
    return placed


def place(element: tuple, placed: dict) -> Iterable[tuple]:
    """`element` (index, source, split) ready to read: a range given the quotes before it
    (`layout`), or, for a file with an irregular quote, the whole file in place of its
    first range (its other ranges yield nothing)."""
    index, source, split = element
    if not isinstance(source, SourceRange):
        yield element
        return
    counts = placed[(source.path, source.start)]
    if counts is None:
        if source.start == 0:
            yield index, source.path, split
        return
    yield index, dataclasses.replace(source, quotes_before=counts[0],
                                     quotes_through=counts[1]), split


def record_bounds(source: SourceRange) -> tuple[int, int]:
    """The bytes [begin, stop) of the records that begin inside `source`: from the first
    record boundary at or after its start to the first at or after its end."""
    return (_boundary(source.path, source.start, source.quotes_before, source.size),
            _boundary(source.path, source.end, source.quotes_through, source.size))


def _boundary(path: str, offset: int, quotes_before: Optional[int], size: int) -> int:
    """The first offset at or after `offset` where a record begins: the file's start, just
    after a line feed with an even count of quotes before it, or the file's end."""
    if offset <= 0 or offset >= size:
        return min(max(offset, 0), size)
    if quotes_before is None:
        raise ValueError(f"{path}: the range from byte {offset} was not surveyed")
    with open_input(path, seekable=True) as stream:
        # From the byte before `offset`: a line feed there makes `offset` a record's start.
        position = offset - 1
        stream.seek(position)
        data = np.frombuffer(stream.read(1), np.uint8)
        quotes = quotes_before - int(len(data) and data[0] == _QUOTE)
        while position < size:
            stream.seek(position)
            data = np.frombuffer(stream.read(_SCAN_BYTES), np.uint8)
            quote_at = np.flatnonzero(data == _QUOTE)
            feeds = np.flatnonzero(data == _LINE_FEED)
            ends = feeds[(quotes + np.searchsorted(quote_at, feeds)) % 2 == 0]
            if len(ends):
                return position + int(ends[0]) + 1
            quotes += len(quote_at)
            position += len(data)
    return size
