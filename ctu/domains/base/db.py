"""The copy-on-write database view every episode writes through.

A domain's database is a JSON document whose top level maps table names to
``{record_id: record}`` dicts (tau2's retail and airline DBs have this shape; telecom's
lists are keyed by their ids when loaded). The loaded document is shared, read-only, by
every episode; each episode writes through a :class:`DBView`, which copies a record the
first time it is edited and keeps the copy in its own overlay. Reset is therefore O(1)
and comparing two episodes' databases only looks at the records either of them touched.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from typing import Any

_DELETED = object()


class DBView:
    """One episode's view of a shared, read-only database, with copy-on-write records.

    ``get`` returns the current record and must be treated as read-only; ``edit``
    returns a private, mutable copy that the view keeps. Callers never mutate what
    ``get`` returns: the base document is shared by every episode in the process.
    """

    __slots__ = ("_base", "_overlay")

    def __init__(self, base: Mapping[str, Mapping[str, Any]]):
        self._base = base
        self._overlay: dict[str, dict[str, Any]] = {}

    # -- reads -------------------------------------------------------------------
    def get(self, table: str, key: str) -> Any:  # None where the row does not exist
        changed = self._overlay.get(table)
        if changed is not None and key in changed:
            value = changed[key]
            return None if value is _DELETED else value
        return self._base.get(table, {}).get(key)

    def __contains__(self, table_key: tuple[str, str]) -> bool:
        table, key = table_key
        return self.get(table, key) is not None

    def keys(self, table: str) -> Iterator[str]:
        changed = self._overlay.get(table, {})
        for key in self._base.get(table, {}):
            if changed.get(key, None) is not _DELETED:
                yield key
        for key, value in changed.items():
            if key not in self._base.get(table, {}) and value is not _DELETED:
                yield key

    def items(self, table: str) -> Iterator[tuple[str, Any]]:
        for key in self.keys(table):
            yield key, self.get(table, key)

    def tables(self) -> list[str]:
        return list(dict.fromkeys([*self._base, *self._overlay]))

    # -- writes ------------------------------------------------------------------
    def edit(self, table: str, key: str) -> Any:
        """A mutable copy of ``table[key]`` owned by this view (KeyError if absent)."""
        changed = self._overlay.setdefault(table, {})
        if key in changed and changed[key] is not _DELETED:
            return changed[key]
        base = self._base.get(table, {}).get(key)
        if base is None:
            raise KeyError(f"{table}/{key}")
        changed[key] = copy.deepcopy(base)
        return changed[key]

    def put(self, table: str, key: str, record: Any) -> None:
        self._overlay.setdefault(table, {})[key] = record

    def delete(self, table: str, key: str) -> None:
        self._overlay.setdefault(table, {})[key] = _DELETED

    def __deepcopy__(self, memo: dict[int, Any]) -> DBView:
        """A view of the same shared base with its own copy of this one's edits (a branched episode's fork)."""
        clone = DBView(self._base)
        clone._overlay = {table: {k: v if v is _DELETED else copy.deepcopy(v, memo) for k, v in changed.items()}
                          for table, changed in self._overlay.items()}
        return clone

    # -- comparison ----------------------------------------------------------------
    def touched(self) -> set[tuple[str, str]]:
        return {(t, k) for t, changed in self._overlay.items() for k in changed}

    def diff(self, other: DBView) -> list[tuple[str, str]]:
        """Records whose content differs between two views of the same base, sorted.

        Tables whose name starts with ``_`` hold an episode's state beside the compared database (tau2 keeps
        such state on its toolkit objects, outside the hashed DB: banking_knowledge's unlocked tools) and are
        left out.
        """
        if self._base is not other._base:
            raise ValueError("can only diff views of the same base database")
        differing = []
        for table, key in sorted(self.touched() | other.touched()):
            if table.startswith("_"):
                continue
            if canonical(self.get(table, key)) != canonical(other.get(table, key)):
                differing.append((table, key))
        return differing

    def materialize(self) -> dict[str, dict[str, Any]]:
        """The full current document (for export and debugging; O(size of DB))."""
        return {t: {k: v for k, v in self.items(t)} for t in self.tables()}


def canonical(value: Any) -> str:
    """Canonical JSON of a value, as tau2 hashes its DB (sorted keys, ``default=str``)."""
    return json.dumps(value, sort_keys=True, default=str)
