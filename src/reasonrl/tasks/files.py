"""Shared plumbing for data-backed tasks: located rows, templates, the training stream.

Reading. ``read_rows(spec)`` accepts ``.jsonl`` (one object per line, blank lines
skipped), ``.json`` (a list of objects), ``.parquet`` (needs pyarrow or pandas)
and ``hf:<name>[:<split>]`` / ``hf:<name>:<config>:<split>`` (a ``datasets``
dataset already in the local cache, loaded in offline mode). Every ``Row``
remembers its file and 1-based line (jsonl) or row number (the rest), so any bad
value is reported where the user can fix it: ``train.jsonl, line 12: ...``.
Relative paths resolve against the current directory.

Streaming. ``stream_indices`` walks a per-(seed, epoch) shuffle of the training
rows: position p of the stream is row ``perm(seed, p // n)[p % n]`` and step s
takes positions ``s*count .. s*count+count-1``. It is a pure function of
(n, step, count, seed), so a resumed run sees the same prompts, and no row
repeats within an epoch. ``ProblemStream`` turns that into a task's
``train_problems``/``eval_problems``.
"""

from __future__ import annotations

import json
import numbers
import os
import random
import re
import string
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Sequence

from reasonrl.problem import Problem

SUPPORTED = ".jsonl, .json, .parquet or hf:<name>[:<split>]"


@dataclass(frozen=True)
class Row:
    """One record of a data file, with where it came from for error messages."""

    data: dict[str, Any]
    source: str  # the path or hf: spec as the user wrote it
    where: str  # "line 12" (jsonl) or "row 12" (json, parquet, hf), 1-based
    index: int  # 0-based position among the file's rows (blank lines not counted)

    def error(self, message: str) -> ValueError:
        return ValueError(f"{self.source}, {self.where}: {message}")

    def field(self, name: str) -> Any:
        if name not in self.data:
            have = ", ".join(map(str, self.data)) or "(none)"
            raise self.error(f"missing field '{name}'; the row has fields: {have}")
        return self.data[name]

    def text(self, name: str) -> str:
        """A field that must be a non-empty string (a question, a prompt)."""
        value = self.field(name)
        if not isinstance(value, str) or not value.strip():
            raise self.error(f"field '{name}' must be a non-empty string, got {value!r}")
        return value

    def answer_text(self, name: str) -> str:
        """A field holding an answer: a non-empty string, or a number written as one."""
        value = self.field(name)
        # numbers.Real admits numpy scalars from parquet; bool is a Real but never an answer
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return str(value)
        return self.text(name)

    def render(self, template: str, values: dict[str, Any] | None = None) -> str:
        """``template`` formatted with the row's fields (``values`` override them)."""
        merged = {**self.data, **(values or {})}
        try:
            return template.format_map(merged)
        except KeyError as exc:
            have = ", ".join(map(str, merged))
            raise self.error(f"template {template!r} refers to field '{exc.args[0]}', "
                             f"which this row lacks; available: {have}") from None


def check_template(template: str, param: str, required: str | None = None) -> list[str]:
    """The field names ``template`` uses; rejects ``{}``/``{0}`` and templates without fields.

    Positional references can never be filled from a row, so they are a recipe
    error found at construction rather than on the first row.
    """
    try:
        parsed = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise ValueError(f"task.{param} {template!r} is not a valid format string: {exc}") from None
    names = [re.split(r"[.\[]", f, maxsplit=1)[0] for f in parsed]
    for name in names:
        if not name or name.isdigit():
            raise ValueError(f"task.{param} {template!r} has an empty or positional field reference "
                             f"'{{{name}}}'; name the field, e.g. '{{{required or 'prompt'}}}'")
    if required is not None and required not in names:
        raise ValueError(f"task.{param} {template!r} must contain '{{{required}}}'")
    if not names:
        raise ValueError(f"task.{param} {template!r} uses no field, so every prompt would be the same")
    return names


# --- reading ---------------------------------------------------------------

def read_rows(spec: str) -> list[Row]:
    """All rows of a data file (see the module docstring for the formats)."""
    if spec.startswith("hf:"):
        rows = _read_hf(spec)
    else:
        path = Path(spec)
        if not path.is_file():
            why = "is a directory" if path.is_dir() else "does not exist"
            raise ValueError(f"data file {spec} {why} (tried {path.resolve()})")
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            rows = _read_jsonl(path, spec)
        elif suffix == ".json":
            rows = _read_json(path, spec)
        elif suffix == ".parquet":
            rows = _read_parquet(path, spec)
        else:
            raise ValueError(f"data file {spec}: unsupported kind '{suffix or '(no suffix)'}'; "
                             f"expected {SUPPORTED}")
    if not rows:
        raise ValueError(f"data file {spec} has no rows (tried {_resolved(spec)})")
    return rows


def _resolved(spec: str) -> str:
    return spec if spec.startswith("hf:") else str(Path(spec).resolve())


def _object_rows(records: Iterator[tuple[str, Any]], source: str) -> list[Row]:
    rows = []
    for where, record in records:
        if not isinstance(record, dict):
            raise ValueError(f"{source}, {where}: expected a JSON object, got {type(record).__name__}")
        rows.append(Row(record, source, where, len(rows)))
    return rows


def _read_jsonl(path: Path, source: str) -> list[Row]:
    def records() -> Iterator[tuple[str, Any]]:
        with path.open("rb") as fh:
            for number, raw in enumerate(fh, start=1):
                line = _decoded(raw, source, number, bom=number == 1)
                if not line.strip():
                    continue
                try:
                    yield f"line {number}", json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{source}, line {number}: invalid JSON ({exc.msg} at column "
                                     f"{exc.colno})") from None

    return _object_rows(records(), source)


def _decoded(raw: bytes, source: str, line: int, bom: bool, offset: int = 0) -> str:
    """``raw`` as UTF-8 text, or a ValueError naming the file, the line and the byte."""
    try:
        return raw.decode("utf-8-sig" if bom else "utf-8")
    except UnicodeDecodeError as exc:
        at = exc.start - offset
        raise ValueError(f"{source}, line {line}: not UTF-8 text (byte {at + 1} of the line is "
                         f"0x{raw[exc.start]:02x}: {exc.reason}); save the file as UTF-8") from None


def _read_json(path: Path, source: str) -> list[Row]:
    raw = path.read_bytes()
    try:
        raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line_start = raw.rfind(b"\n", 0, exc.start) + 1
        _decoded(raw, source, raw.count(b"\n", 0, exc.start) + 1, bom=True, offset=line_start)
    try:
        data = json.loads(raw.decode("utf-8-sig"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}, line {exc.lineno}: invalid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(data, list):
        raise ValueError(f"{source}: expected a JSON list of objects, got {type(data).__name__}")
    return _object_rows(((f"row {i}", r) for i, r in enumerate(data, start=1)), source)


def _read_parquet(path: Path, source: str) -> list[Row]:
    try:
        import pyarrow.parquet as pq

        records = pq.read_table(path).to_pylist()
    except ImportError:
        try:
            import pandas as pd
        except ImportError:
            raise ImportError(f"reading {source} needs pyarrow (or pandas): pip install pyarrow") from None
        records = pd.read_parquet(path).to_dict("records")
    return _object_rows(((f"row {i}", r) for i, r in enumerate(records, start=1)), source)


def parse_hf_spec(spec: str) -> tuple[str, str | None, str]:
    """``hf:name`` / ``hf:name:split`` / ``hf:name:config:split`` -> (name, config, split)."""
    parts = spec[len("hf:"):].split(":")
    if not parts[0] or len(parts) > 3 or not all(parts):
        raise ValueError(f"bad dataset spec {spec!r}; expected hf:<name>[:<split>] or hf:<name>:<config>:<split>")
    if len(parts) == 1:
        return parts[0], None, "train"
    if len(parts) == 2:
        return parts[0], None, parts[1]
    return parts[0], parts[1], parts[2]


def _read_hf(spec: str) -> list[Row]:
    name, config, split = parse_hf_spec(spec)
    try:
        import datasets
    except ImportError:
        raise ImportError(f"reading {spec} needs the 'datasets' package: pip install datasets") from None
    with _hf_offline(datasets):
        try:
            ds = datasets.load_dataset(name, config, split=split)
        except Exception as exc:  # noqa: BLE001 — any failure means "not in the local cache"
            raise ValueError(f"cannot load {spec} from the local datasets cache (offline mode; download "
                             f"it once with datasets.load_dataset): {type(exc).__name__}: {exc}") from None
    return _object_rows(((f"row {i}", r) for i, r in enumerate(ds, start=1)), spec)


@contextmanager
def _hf_offline(datasets_module: Any) -> Iterator[None]:
    # datasets reads its offline flag at import time into module constants, so the
    # environment variable alone is too late; switch the constants for this call only,
    # leaving model downloads elsewhere in the process unaffected.
    targets = [getattr(datasets_module, "config", None)]
    try:
        import huggingface_hub.constants as hub_constants

        targets.append(hub_constants)
    except ImportError:
        pass
    saved = [(t, a, getattr(t, a)) for t in targets if t is not None
             for a in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if hasattr(t, a)]
    env = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    try:
        for target, attr, _ in saved:
            setattr(target, attr, True)
        os.environ.update({k: "1" for k in env})
        yield
    finally:
        for target, attr, value in saved:
            setattr(target, attr, value)
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --- the training stream and the held-out head -----------------------------

@lru_cache(maxsize=8)
def epoch_order(n: int, seed: int, epoch: int) -> tuple[int, ...]:
    """The permutation of ``range(n)`` used in one epoch; a string seed is stable across processes."""
    order = list(range(n))
    random.Random(f"stream:{seed}:{epoch}").shuffle(order)
    return tuple(order)


def stream_indices(n: int, step: int, count: int, seed: int) -> list[int]:
    """Row indices at stream positions ``step*count .. step*count+count-1``."""
    if n < 1:
        raise ValueError("the training split is empty")
    if step < 0 or count < 0:
        raise ValueError(f"step and count must be >= 0, got step={step}, count={count}")
    out = []
    for position in range(step * count, step * count + count):
        epoch, offset = divmod(position, n)
        out.append(epoch_order(n, seed, epoch)[offset])
    return out


def head(items: Sequence[Any], count: int, source: str) -> list[Any]:
    """The first ``count`` items, or an error saying how many ``source`` has."""
    if count < 0 or count > len(items):
        raise ValueError(f"asked for {count} eval problems; {source} has {len(items)}")
    return [items[i] for i in range(count)]


class ProblemStream:
    """``train_problems``/``eval_problems`` over two record sequences.

    A subclass sets ``_train`` and ``_eval`` (sequences of records),
    ``_eval_source`` (named in errors) and implements ``_problem(record, split)``.
    Problems are built on demand so long few-shot prompts are not held per row.
    """

    eval_split = "eval"
    _train: Sequence[Any]
    _eval: Sequence[Any]
    _eval_source: str

    def _problem(self, record: Any, split: str) -> Problem:
        raise NotImplementedError

    def train_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        return [self._problem(self._train[i], "train") for i in stream_indices(len(self._train), step, count, seed)]

    def eval_problems(self, count: int) -> list[Problem]:
        return [self._problem(r, self.eval_split) for r in head(self._eval, count, self._eval_source)]
