"""Caches the span encoders share (OTLP protobuf in ``otlp/encoding.py``, OTLP/JSON in
``span_file.py``): encoded key/value pairs, and encoded resources and scopes by identity.

Key/value pairs are cached by ``(key, type, value)`` for values whose equal values of one type
encode alike (strings, booleans, integers, bytes); floats are not cached (``-0.0 == 0.0``
while their encodings differ, and they are the values that change: a loss, a duration).

Usage::

    kv = KeyValueCache(encode_kv)               # encode_kv(key, value) -> bytes | str
    parts = kv.encode(attrs.items())
    by_id = IdentityCache(); by_id.get(resource, make_resource_bytes)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

_log = logging.getLogger("otel_train")
_MAX_CACHED = 8192
_CACHED_TYPES = frozenset((str, bool, int, bytes))
T = TypeVar("T")


class KeyValueCache(Generic[T]):
    """Encoded attributes, one entry per (key, type, value) of a cacheable type."""

    def __init__(self, encode_kv: Callable[[str, Any], T]) -> None:
        self._encode_kv = encode_kv
        self._cache: dict[tuple[str, type, Any], T] = {}

    def encode(self, items: Iterable[tuple[str, Any]]) -> list[T]:
        """The encoded pairs, in order; a value that cannot be encoded is skipped (logged),
        as the SDK skips it."""
        cache, encode_kv = self._cache, self._encode_kv
        out = []
        for key, value in items:
            t = type(value)
            if t in _CACHED_TYPES:
                ck = (key, t, value)
                kv = cache.get(ck)
                if kv is None:
                    kv = encode_kv(key, value)
                    if len(cache) >= _MAX_CACHED:
                        cache.clear()
                    cache[ck] = kv
            else:
                try:
                    kv = encode_kv(key, value)
                except Exception as exc:
                    _log.debug("otel-train: cannot encode attribute %s: %r", key, exc)
                    continue
            out.append(kv)
        return out


class IdentityCache(Generic[T]):
    """One encoding per object (a run's resource and scopes are made once and kept)."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[Any, T]] = {}

    def get(self, obj: Any, make: Callable[[Any], T]) -> T:
        """``make(obj)``, made once for ``obj``."""
        hit = self._cache.get(id(obj))
        if hit is not None and hit[0] is obj:
            return hit[1]
        value = make(obj)
        if len(self._cache) >= 256:
            self._cache.clear()
        self._cache[id(obj)] = (obj, value)
        return value


class ForeignScope:
    """Mixin of an encoded span (``bytes`` or ``str``) of a scope other than otel-train's:
    a user span opened with the OTel API; ``scope`` is its row's ``(name, version, schema)``."""

    scope: tuple[Any, ...]

    @classmethod
    def tagged(cls, encoded: Any, scope: tuple[Any, ...] | None) -> Any:
        """``encoded`` as it is for otel-train's scope (None), else tagged with ``scope``."""
        if scope is None:
            return encoded
        item = cls(encoded)  # type: ignore[call-arg]
        item.scope = scope
        return item


def by_scope(items: Iterable[T]) -> dict[tuple[Any, ...] | None, list[T]]:
    """Encoded spans grouped by scope (None: otel-train's), in order of first appearance."""
    groups: dict[tuple[Any, ...] | None, list[T]] = {}
    for item in items:
        groups.setdefault(getattr(item, "scope", None), []).append(item)
    return groups
