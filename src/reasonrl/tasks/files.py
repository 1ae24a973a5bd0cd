"""Shared plumbing for data-backed tasks: located rows, templates, the training stream.

Reading. ``read_rows(spec)`` accepts ``.jsonl`` (one object per line, blank lines
skipped), ``.json`` (a list of objects), ``.parquet`` (needs pyarrow or pandas)
and ``hf:<name>[:<split>]`` / ``hf:<name>:<config>:<split>`` (a ``datasets``
dataset already in the local cache, loaded in offline mode). Every ``Row``
remembers its file and 1-based line (jsonl) or row number (the rest), so any bad
value is reported where the user can fix it: ``train.jsonl, line 12: ...``.
Relative paths resolve against the current directory. JSON is read strictly:
``NaN``/``Infinity``, a number too large for a float, an integer longer than
Python converts (4300 digits) and nesting deeper than its parser recurses
(about 1000 levels) are each refused with the file and line, never turned into
``"nan"`` or a traceback. ``.json`` lists are decoded one element at a time so
such an error also names the row.

Streaming. ``stream_indices`` walks a per-(seed, epoch) shuffle of the training
rows: position p of the stream is row ``perm(seed, p // n)[p % n]`` and step s
takes positions ``s*count .. s*count+count-1``. It is a pure function of
(n, step, count, seed), so a resumed run sees the same prompts, and no row
repeats within an epoch. ``ProblemStream`` turns that into a task's
``train_problems``/``eval_problems``; its records that carry an ``origin`` (a row
of a file) can be listed with their prompts and refitted by the load-time check
of prompt lengths (``reasonrl.tasks.lengths``).
"""

from __future__ import annotations

import json
import math
import numbers
import os
import random
import re
import string
import sys
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from reasonrl.problem import Problem

SUPPORTED = ".jsonl, .json, .parquet or hf:<name>[:<split>]"


@dataclass(frozen=True)
class Row:
    """One record of a data file, with where it came from for error messages."""

    data: dict[str, Any]
    source: str  # the path or hf: spec as the user wrote it
    where: str  # "line 12" (jsonl) or "row 12" (json, parquet, hf), 1-based
    index: int  # 0-based position among the file's rows (blank lines not counted)

    @property
    def origin(self) -> str:
        """Where the row is, as errors name it: ``train.jsonl, line 12``."""
        return f"{self.source}, {self.where}"

    def error(self, message: str) -> ValueError:
        return ValueError(f"{self.origin}: {message}")

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
            if not math.isfinite(value):  # a parquet NaN would otherwise become the answer "nan"
                raise self.error(f"field '{name}' is {value}; an answer must be a finite number or text")
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


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows; write the value as a string or drop the row")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is too large for a float; write it as a string")
    return value


def _bounded_int(text: str) -> int:
    limit = sys.get_int_max_str_digits()
    digits = len(text.lstrip("-"))
    if limit and digits > limit:  # int() would fail with a message that names no file
        raise ValueError(f"an integer of {digits} digits is longer than Python converts ({limit} digits); "
                         "write it as a string")
    return int(text)


# Strict JSON: no NaN/Infinity (json.loads takes them and a NaN answer became "nan"), no float overflow to inf.
_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float, parse_int=_bounded_int)
_SPACE = re.compile(r"[ \t\n\r]*")


@contextmanager
def _json_errors(source: str, where: Callable[[], str], first_line: int = 1) -> Iterator[None]:
    """Any failure to decode JSON as a ValueError naming ``source`` and the line: a syntax error
    at its own line (``first_line`` is the line the decoded text starts on), anything else
    (nesting, the decoder's refusals above) at ``where()``."""
    try:
        yield
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}, line {first_line + exc.lineno - 1}: invalid JSON ({exc.msg} at column "
                         f"{exc.colno})") from None
    except RecursionError:
        raise ValueError(f"{source}, {where()}: JSON nested too deeply (Python's parser stops at about "
                         f"{sys.getrecursionlimit()} levels of lists and objects)") from None
    except ValueError as exc:
        raise ValueError(f"{source}, {where()}: {exc}") from None


def _read_jsonl(path: Path, source: str) -> list[Row]:
    def records() -> Iterator[tuple[str, Any]]:
        with path.open("rb") as fh:
            for number, raw in enumerate(fh, start=1):
                line = _decoded(raw, source, number, bom=number == 1)
                if not line.strip():
                    continue
                with _json_errors(source, lambda: f"line {number}", first_line=number):
                    record = _DECODER.decode(line)
                yield f"line {number}", record

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
    text = raw.decode("utf-8-sig")
    return _object_rows(((f"row {i}", r) for i, r in enumerate(_json_list(text, source), start=1)), source)


def _json_list(text: str, source: str) -> list[Any]:
    """The elements of the JSON list ``text``, decoded one by one so an error names its row."""
    at = _SPACE.match(text).end()
    if not text.startswith("[", at):
        with _json_errors(source, lambda: "line 1"):
            data = _DECODER.decode(text)
        raise ValueError(f"{source}: expected a JSON list of objects, got {type(data).__name__}")
    out: list[Any] = []
    at = _SPACE.match(text, at + 1).end()
    closed = text.startswith("]", at)
    while not closed:
        start = at
        with _json_errors(source, lambda: f"line {text.count(chr(10), 0, start) + 1} (row {len(out) + 1})"):
            value, at = _DECODER.raw_decode(text, at)
            out.append(value)
            at = _SPACE.match(text, at).end()
            if text.startswith(",", at):
                at = _SPACE.match(text, at + 1).end()
            elif text.startswith("]", at):
                closed = True
            else:
                raise json.JSONDecodeError("Expecting ',' delimiter", text, at)
    at = _SPACE.match(text, at + 1).end()
    if at != len(text):
        with _json_errors(source, lambda: "line 1"):
            raise json.JSONDecodeError("Extra data", text, at)
    return out


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
    Records with an ``origin`` attribute (``Row.origin``: where the row is) are listed by
    ``located_prompts`` and can be refitted with ``fit_prompts`` (skip or truncate a row).
    """

    eval_split = "eval"
    _train: Sequence[Any]
    _eval: Sequence[Any]
    _eval_source: str
    _cut: dict[tuple[str, int], str] = {}  # (split, position) -> its truncated prompt; set by fit_prompts

    def _problem(self, record: Any, split: str) -> Problem:
        raise NotImplementedError

    def _records(self, split: str) -> Sequence[Any]:
        return self._train if split == "train" else self._eval

    def _make(self, split: str, i: int) -> Problem:
        problem = self._problem(self._records(split)[i], "train" if split == "train" else self.eval_split)
        cut = self._cut.get((split, i))
        return problem if cut is None else replace(problem, prompt=cut)

    def train_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        return [self._make("train", i) for i in stream_indices(len(self._train), step, count, seed)]

    def eval_problems(self, count: int) -> list[Problem]:
        return [self._make("eval", i) for i in head(range(len(self._eval)), count, self._eval_source)]

    def origin(self, split: str, i: int) -> str | None:
        """Where row ``i`` of ``split`` ("train" or "eval") comes from, e.g. ``train.jsonl, line 12``."""
        return getattr(self._records(split)[i], "origin", None)

    def located_prompts(self, split: str) -> Iterator[tuple[str, str]]:
        """(origin, prompt) of every row of ``split`` in order; nothing when its rows come from no file."""
        for i in range(len(self._records(split))):
            where = self.origin(split, i)
            if where is None:
                return
            yield where, self._make(split, i).prompt

    def fit_prompts(self, split: str, prompts: Sequence[str | None]) -> None:
        """Keep the rows of ``split`` whose entry of ``prompts`` (one per row) is not None, each with
        that prompt. The stream is a function of the row count, so the rows kept define it."""
        records = self._records(split)
        kept = [(i, p) for i, p in enumerate(prompts) if p is not None]
        cut = {(s, j): text for (s, j), text in self._cut.items() if s != split}
        for new, (i, prompt) in enumerate(kept):
            if prompt != self._make(split, i).prompt:
                cut[(split, new)] = prompt
        rows = [records[i] for i, _ in kept]
        self._cut = cut
        if split == "train":
            self._train = rows
        else:
            self._eval = rows
