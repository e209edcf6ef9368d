"""The global TracerProvider: otel-train's run-scoped one, or the application's own.

``set_tracer_provider`` works once per process while runs come and go, so otel-train installs
one provider that forwards to whichever run is active (``RunScopedTracerProvider``).
"""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import TracerProvider


class RunScopedTracerProvider(trace_api.TracerProvider):
    """The global provider otel-train installs when the application has none.

    ``set_tracer_provider`` works once per process; runs come and go. This provider forwards
    to the current run's SDK provider, so user spans always reach the run that is active.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: TracerProvider | None = None

    def activate(self, provider: TracerProvider | None) -> None:
        """Point at ``provider`` (None: no run active, tracers become no-ops)."""
        with self._lock:
            self._current = provider

    def after_fork_in_child(self) -> None:
        """In a forked child: forget the parent's run (its lock may be held by a lost thread)."""
        self._lock = threading.Lock()
        self._current = None

    @property
    def current(self) -> TracerProvider | None:
        """The active run's provider."""
        return self._current

    def get_tracer(self, instrumenting_module_name: str, *args: Any, **kwargs: Any
                   ) -> trace_api.Tracer:
        """A tracer that resolves to the active run's provider at each span start."""
        return _RunScopedTracer(self, instrumenting_module_name, args, kwargs)


class _RunScopedTracer(trace_api.Tracer):
    def __init__(self, owner: RunScopedTracerProvider, name: str, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        self._owner = owner
        self._name = name
        self._args = args
        self._kwargs = kwargs
        self._cache: tuple[TracerProvider | None, trace_api.Tracer] | None = None

    def _target(self) -> trace_api.Tracer:
        provider = self._owner.current
        cache = self._cache
        if cache is not None and cache[0] is provider:
            return cache[1]
        tracer = (provider.get_tracer(self._name, *self._args, **self._kwargs)
                  if provider is not None else trace_api.NoOpTracer())
        self._cache = (provider, tracer)
        return tracer

    def start_span(self, *args: Any, **kwargs: Any) -> trace_api.Span:
        return self._target().start_span(*args, **kwargs)

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return self._target().start_as_current_span(*args, **kwargs)


def global_provider_for_run() -> tuple[str, Any]:
    """('ours', RunScopedTracerProvider) or ('app', the application's SDK provider).

    Installs otel-train's run-scoped provider as the global one when the application has
    none; reuses the application's SDK provider when it set one.
    """
    current = trace_api.get_tracer_provider()
    if isinstance(current, RunScopedTracerProvider):
        return "ours", current
    if isinstance(current, TracerProvider):
        return "app", current
    if isinstance(current, trace_api.ProxyTracerProvider):
        ours = RunScopedTracerProvider()
        trace_api.set_tracer_provider(ours)
        if trace_api.get_tracer_provider() is ours:
            return "ours", ours
        current = trace_api.get_tracer_provider()
        if isinstance(current, TracerProvider):
            return "app", current
    # Some other API-level provider (a vendor's): leave it alone.
    return "foreign", current
