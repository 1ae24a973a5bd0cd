"""Named registries for every pluggable stage of the data flow.

A recipe names components by string (``advantage: {name: grpo}``); the
registry turns the name into the function or class and reports the closest
known name when a user mistypes one.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable, Dict, Iterator, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """An unknown registry name; the message lists the known names."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0])


def closest_match_hint(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    return f" Did you mean '{close[0]}'?" if close else ""


class Registry:
    """A mapping from name to component, with duplicate and typo checks."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: Dict[str, Any] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            existing = self._items.get(name)
            if existing is not None and existing is not obj:
                raise ValueError(f"{self.kind} '{name}' is already registered to {existing!r}")
            self._items[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> Any:
        try:
            return self._items[name]
        except KeyError:
            known = sorted(self._items)
            raise UnknownNameError(
                f"unknown {self.kind} '{name}'; known: {', '.join(known)}.{closest_match_hint(name, known)}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))


ADVANTAGES = Registry("advantage estimator")
POLICY_LOSSES = Registry("policy loss")
KL_ESTIMATORS = Registry("KL estimator")
REWARDS = Registry("reward function")
TOKEN_REWARDS = Registry("token reward function")
SELECTORS = Registry("selector")
TASKS = Registry("task")
