"""Values a sandboxed program hands back as data, never as objects it built.

A reward that runs model-written code must not let that code grade itself: if the tests'
expected values, the comparison or another rollout share the program's interpreter, the program
can read them (``gc``, frames, format strings) or replace them (``__eq__``, the harness's own
functions). So the rewards that run model code (``python_tests``, FSG-RL's verifier) give the
sandboxed program only the *inputs* (the expressions to evaluate) and have it write each value
back as one JSON line; the parent decodes the lines here and compares them with the expected
values itself. Whatever the program does in there, it can then only choose the values it
reports, which is what any program can do honestly.

Encoding (:data:`ENCODE`, Python source that the child harness includes; ``_enc(v)``), by
**exact** type (``type(v) is int``), so a subclass with a forged ``__eq__`` or ``__int__`` is
not taken for a number:

=============================  ====================================================
``None``, bool, float, str     as JSON (NaN and ±inf as JSON's ``NaN``/``Infinity``;
                               str at most 10 000 characters)
int                            as JSON, at most 14 000 bits (~4 200 digits)
Fraction                       ``{"fraction": [numerator, denominator]}``
complex, bytes                 ``{"complex": [re, im]}``, ``{"bytes": "<hex>"}``
list, tuple, set, frozenset    ``{"list": [...]}``, ``{"tuple": [...]}``, ``{"set": [...]}``
dict                           ``{"dict": [[key, value], ...]}``
anything else                  ``{"unencodable": 0}`` (subclasses, namedtuples, enums,
                               ``OrderedDict``: unwrap them on the computed side)
an exception                   ``{"raised": "<its class name>"}``
=============================  ====================================================

Containers nest at most 16 deep and hold at most 10 000 items in all; a value past a limit,
or whose encoding raises, is ``unencodable``.

Decoding (:func:`decode`, the parent): the inverse, built from the parent's own types only
(sets come back as ``frozenset``); ``unencodable`` becomes an :class:`Opaque`, which refuses
every comparison, truth test and hash (so a test on it fails), and ``raised`` the sentinel
:data:`RAISED`. :func:`read_rows` reads the marked lines; a line that is not valid JSON
(truncated, nested past the parser's recursion limit, an integer past 4 300 digits) is
dropped, and :func:`decode` raises :class:`Malformed` for any shape it does not know: the
caller counts such a row as no result.
"""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

__all__ = ["ENCODE", "MARK", "Malformed", "Opaque", "RAISED", "decode", "read_rows"]

MARK = "\x1ereasonrl-value:"  # starts every result line (a program's own prints do not)

ENCODE = r'''
import fractions as _fractions
def _enc(v):
    room = [10000]
    def enc(v, depth):
        room[0] -= 1
        if room[0] < 0 or depth > 16:
            raise ValueError("too large")
        t = type(v)
        if v is None or t is bool or t is float:
            return v
        if t is int:
            if v.bit_length() > 14000:
                raise ValueError("int too large")
            return v
        if t is str:
            if len(v) > 10000:
                raise ValueError("str too long")
            return v
        if t is _fractions.Fraction:
            return {"fraction": [enc(v.numerator, depth + 1), enc(v.denominator, depth + 1)]}
        if t is complex:
            return {"complex": [v.real, v.imag]}
        if t is bytes:
            if len(v) > 10000:
                raise ValueError("bytes too long")
            return {"bytes": v.hex()}
        if t is list or t is tuple:
            return {t.__name__: [enc(x, depth + 1) for x in v]}
        if t is set or t is frozenset:
            return {"set": [enc(x, depth + 1) for x in v]}
        if t is dict:
            return {"dict": [[enc(k, depth + 1), enc(x, depth + 1)] for k, x in v.items()]}
        raise ValueError("unencodable type")
    try:
        return enc(v, 0)
    except Exception:  # not BaseException: a harness's per-test alarm must still end the test
        return {"unencodable": 0}
'''


class Malformed(ValueError):
    """A result row or value the child could not have written honestly (an unknown shape)."""


class Opaque:
    """A value the child could not encode: equal to nothing, not even itself; no truth value."""

    def _refuse(self, *_: Any) -> bool:
        raise TypeError("an unencodable value (see reasonrl.isolation.sandbox.values)")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __hash__ = _refuse  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "<unencodable>"


class _Raised:
    def __repr__(self) -> str:
        return "<raised>"


RAISED = _Raised()  # the expression raised (or timed out) in the child

_MAX_DEPTH = 17


def decode(obj: Any, depth: int = 0) -> Any:
    """The value a JSON-decoded ``obj`` stands for (module docstring); :class:`Malformed` if
    ``obj`` is not an encoding :data:`ENCODE` writes."""
    if obj is None or type(obj) in (bool, int, float, str):
        return obj
    if type(obj) is not dict or len(obj) != 1 or depth > _MAX_DEPTH:
        raise Malformed(f"not an encoded value: {type(obj).__name__}")
    (tag, body), = obj.items()
    if tag == "unencodable":
        return Opaque()
    if tag == "raised" and depth == 0:
        return RAISED
    if tag == "fraction" and type(body) is list and len(body) == 2 and all(type(x) is int for x in body) and body[1]:
        return Fraction(body[0], body[1])
    if tag == "complex" and type(body) is list and len(body) == 2 and all(type(x) in (int, float) for x in body):
        return complex(body[0], body[1])
    if tag == "bytes" and type(body) is str:
        try:
            return bytes.fromhex(body)
        except ValueError:
            raise Malformed("bytes: not hex") from None
    if tag in ("list", "tuple", "set") and type(body) is list:
        items = [decode(x, depth + 1) for x in body]
        if tag == "list":
            return items
        if tag == "tuple":
            return tuple(items)
        try:
            return frozenset(items)
        except TypeError:  # an unhashable (or opaque) element: the set itself cannot be compared
            return Opaque()
    if tag == "dict" and type(body) is list and all(type(kv) is list and len(kv) == 2 for kv in body):
        try:
            return {decode(k, depth + 1): decode(v, depth + 1) for k, v in body}
        except TypeError:
            return Opaque()
    raise Malformed(f"not an encoded value: tag {tag!r}")


def read_rows(text: str, mark: str = MARK) -> list[dict]:
    """The JSON objects of the lines of ``text`` that start with ``mark``, in order; a line that
    does not parse (truncated, too deeply nested, an integer too long) or is not an object is
    dropped."""
    rows = []
    for line in text.split("\n"):
        if not line.startswith(mark):
            continue
        try:
            row = json.loads(line[len(mark):])
        except (ValueError, RecursionError):
            continue
        if type(row) is dict:
            rows.append(row)
    return rows
