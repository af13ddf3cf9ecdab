"""A user's data file read row by row, every problem named by the file, the line and the field.

A data file is JSON Lines (``.jsonl``: one JSON object a line, blank lines skipped) or, in a ``.json`` file, either
JSON Lines or one JSON array of objects (the two layouts ``datasets.load_dataset("json")`` reads). Everything is
checked before a model is loaded or a folder written: an empty file, a line that is not JSON, a row that is not an
object, a field missing from a later row or holding the wrong thing would otherwise surface mid-run as a bare
``StopIteration``, ``TypeError`` or ``AttributeError``, or train silently on the text "None".
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

#: A field's check: (does this value do, what it must be in words).
Check = tuple[Callable[[object], bool], str]


def read_rows(path: str | Path) -> list[tuple[int, dict]]:
    """Every row of a JSON Lines file, or of a ``.json`` file's array, with its 1-based line number.

    Example: a file of the lines '{"q": 1}', '', '{"q": 2}' -> [(1, {"q": 1}), (3, {"q": 2})].

    Returns:
        (line, row) for each row, in file order; for an array, the line on which the row starts.

    Raises:
        FileNotFoundError: "no data file at PATH".
        ValueError: "PATH: no rows (the file is empty)"; "PATH, line N: not valid JSON (...)"; "PATH, line N:
            expected a JSON object, got list" (a row that is not an object, or a ``.jsonl`` file holding an array).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no data file at {path}")
    text = path.read_text()
    if path.suffix == ".json" and text.lstrip().startswith("["):
        rows = _array_rows(path, text)
    else:
        rows = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    rows.append((lineno, json.loads(line)))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}, line {lineno}: not valid JSON ({e.msg}, column {e.colno})") from None
    if not rows:
        raise ValueError(f"{path}: no rows (the file is empty)")
    for lineno, row in rows:
        if not isinstance(row, dict):
            raise ValueError(f"{path}, line {lineno}: expected a JSON object (a row of named fields), got "
                             f"{type(row).__name__}")
    return rows


def _array_rows(path: Path, text: str) -> list[tuple[int, object]]:
    """The elements of a JSON array, each with the line it starts on (the array is parsed whole first, so a syntax
    error names its own line)."""
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}, line {e.lineno}: not valid JSON ({e.msg}, column {e.colno})") from None
    decoder, rows = json.JSONDecoder(), []
    i = _skip(text, text.index("[") + 1)
    while text[i] != "]":
        value, end = decoder.raw_decode(text, i)
        rows.append((text.count("\n", 0, i) + 1, value))
        i = _skip(text, end)
        i = _skip(text, i + 1) if text[i] == "," else i
    return rows


def _skip(text: str, i: int) -> int:
    """The index of the first non-whitespace character at or after i."""
    while text[i] in " \t\r\n":
        i += 1
    return i


def check_fields(path: str | Path, rows: list[tuple[int, dict]], checks: dict[str, Check]) -> None:
    """Every row holds every field of ``checks``, and each field's value passes its check.

    Example: checks {"answer": (lambda v: isinstance(v, str), "a string")} and a row {"question": "..."} on line 7
    -> ValueError "train.jsonl, line 7: field 'answer' missing (the row has 'question'; every row needs 'answer')".

    Args:
        path: the file, for the message.
        rows: ``read_rows``'s (line, row) pairs.
        checks: field name -> (predicate, what the value must be, in words).

    Raises:
        ValueError: naming the file, the line and the field: a field missing, or a value that fails its check
            (shown, cut to 60 characters).
    """
    for lineno, row in rows:
        for name, (ok, what) in checks.items():
            if name not in row:
                raise ValueError(f"{path}, line {lineno}: field {name!r} missing (the row has "
                                 f"{', '.join(map(repr, row)) or 'no field'}; every row needs "
                                 f"{', '.join(map(repr, checks))})")
            if not ok(row[name]):
                shown = json.dumps(row[name])
                shown = shown if len(shown) <= 60 else shown[:57] + "..."
                raise ValueError(f"{path}, line {lineno}: field {name!r} is {shown}, not {what}")
