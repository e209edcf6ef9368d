"""What the process does to live runs: fork, SIGTERM and exit.

- **fork**: a child gets a copy of the parent's runs, but not their threads, and any lock a
  background thread held at that instant stays held forever in the child. So in the child
  every inherited run is made inert at once (``Run._after_fork_in_child``): its queues are
  dropped without export (the parent exports them), its metrics socket is closed, and its
  shutdown touches no inherited lock. DataLoader workers started by fork pay one callback and
  export nothing; a child that trains can start its own run.
- **SIGTERM** (Slurm, Kubernetes and torchrun send it): when the application has not set a
  handler of its own, the first run installs one on the main thread. It cuts each live run's
  step off (exported failed, ``train.truncated.reason = "sigterm"``), shuts the runs down
  within their ``shutdown_timeout_seconds`` (flush, final ``monitoring_costs.json``, drops
  counted), then restores the default handler and
  re-sends the signal, so the process ends the way the scheduler expects (exit by SIGTERM).
  With a handler of your own, call ``run.shutdown()`` in it. SIGINT already raises
  ``KeyboardInterrupt``, which ends a ``with start_run()`` block (or interpreter exit) cleanly.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import weakref
from types import FrameType
from typing import Any, Protocol

from otel_train.common.options import RunOptions


class Run(Protocol):
    """What this module needs of a run (``otel_train.run.Run``): it sits below it."""

    options: RunOptions

    def _after_fork_in_child(self) -> None: ...

    def _interrupt(self, error: BaseException, reason: str = ...) -> None: ...

_log = logging.getLogger("otel_train")
_live: weakref.WeakSet[Run] = weakref.WeakSet()
_registered_fork = False
_sigterm_installed = False
_lock = threading.Lock()


class RunInterrupted(Exception):  # noqa: N818 (it is what happened, not an error of ours)
    """The run was ended by a signal while this step ran."""


def track(run: Run) -> None:
    """Watch ``run`` across fork and SIGTERM (call once per run, from its constructor)."""
    global _registered_fork
    with _lock:
        _live.add(run)
        if not _registered_fork and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _registered_fork = True
    _install_sigterm()


def untrack(run: Run) -> None:
    """Stop watching ``run`` (it shut down)."""
    with _lock:
        _live.discard(run)


def _after_fork_in_child() -> None:
    # Only the forking thread exists here; _lock may be held by a thread that is gone.
    global _lock
    _lock = threading.Lock()
    runs = list(_live)
    _live.clear()
    if runs:
        _drop_stale_import_locks()
    for run in runs:
        try:
            run._after_fork_in_child()
        except Exception:  # never break a fork (DataLoader workers fork all the time)
            pass


def _drop_stale_import_locks() -> None:
    """Forget per-module import locks that a thread lost in the fork still holds.

    Our export threads import lazily on every request (``requests`` does ``from netrc import
    ...`` in each one): a fork at that instant leaves the child a module lock nobody will ever
    release, and the child's next import of that module (its own run exporting, say) hangs.
    CPython re-creates the global import lock after fork, not the per-module ones (3.11), so
    drop those whose owner is gone: the next import of that module makes a fresh lock.
    """
    try:
        import importlib._bootstrap as bootstrap

        me = threading.get_ident()
        locks = bootstrap._module_locks  # name -> weakref to _ModuleLock
        for name, ref in list(locks.items()):
            lock = ref()
            owner = getattr(lock, "owner", 0) if lock is not None else 0
            if owner and owner != me:
                locks.pop(name, None)
    except Exception:  # private API: if it changes, we only lose this safety net
        pass


def _install_sigterm() -> None:
    global _sigterm_installed
    if _sigterm_installed or threading.current_thread() is not threading.main_thread():
        return
    try:
        current = signal.getsignal(signal.SIGTERM)
    except (ValueError, OSError):
        return
    if current is not signal.SIG_DFL:
        # The application (or a launcher) handles SIGTERM itself: it calls run.shutdown().
        return
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
        _sigterm_installed = True
    except (ValueError, OSError):
        pass


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Shut every live run down (bounded), then die of SIGTERM as if we were never here."""
    global _sigterm_installed
    runs = list(_live)
    # Shut down on a helper thread, joined with a bound: the signal interrupted the main
    # thread at an arbitrary point, possibly inside a lock the shutdown needs. A deadlock then
    # costs the bound, never a hang.
    worker = threading.Thread(target=_shutdown_all, args=(runs, signum),
                              name="otel-train-sigterm", daemon=True)
    worker.start()
    worker.join(max((r.options.shutdown_timeout_seconds for r in runs), default=0.0) + 0.5)
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _sigterm_installed = False
    except (ValueError, OSError):
        pass
    os.kill(os.getpid(), signum)


def _shutdown_all(runs: list[Any], signum: int) -> None:
    name = signal.Signals(signum).name
    for run in runs:
        try:
            # The step in progress is exported cut off: train.truncated.reason = "sigterm".
            run._interrupt(RunInterrupted(f"{name}: the run was interrupted"), name.lower())
        except Exception as exc:
            _log.warning("otel-train: shutdown on %s failed: %r", name, exc)
