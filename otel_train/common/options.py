"""Run options: keyword arguments, each also read from ``OTEL_TRAIN_<NAME>``.

Precedence: an explicit keyword argument, then ``OTEL_TRAIN_<NAME>``, then the default.
Every option is validated once, at ``start_run``; a bad value raises ``ValueError`` that
names the option (and the environment variable when it came from there) and the rule.

Usage::

    opts = RunOptions.resolve(budget=0.05, prometheus_port=0)
    opts.budget            # 0.05
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from otel_train.common.export_ranks import SPAN_MODES, parse_export_ranks

ENV_PREFIX = "OTEL_TRAIN_"
DEFAULT_PROMETHEUS_PORT = 9464
# Also what a run directory without a costs file is read with (rundir/compare_read.py).
DEFAULT_WARMUP_STEPS = 5

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_NONE = {"", "none", "null", "off", "disabled"}
_DEVICE_SYNC = ("auto", "monitor_sync", "sync", "events", "off")
_EXPORTERS = ("auto", "otlp", "jsonl", "console", "none")
_PROTOCOLS = ("grpc", "http/protobuf")
_METRICS_EXPORTERS = ("prometheus", "otlp", "none")
_TRACE_EXPORT = ("own", "application")
_RANK_LABELS = ("all", "gauges")


class _Default:
    """Marker for 'use the computed default' (distinct from ``None`` = disabled)."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Any = _Default()


def _choice(default: Any) -> Any:
    """A field whose value is one of a few names: read from the environment lower-cased."""
    return field(default=default, metadata={"env": "choice"})


@dataclass(frozen=True)
class RunOptions:
    """All options of a run, validated. Build with :meth:`RunOptions.resolve`."""

    service_name: str | None = None
    run_id: str | None = None
    # False (or OTEL_SDK_DISABLED=true): the API works, nothing is recorded or started.
    enabled: bool = True
    device_sync: str = _choice("auto")
    budget: float = 0.05
    critical: float = 0.10
    # "report": measure, warn and advise; "govern": also stretch the intervals of the
    # operations scheduled with step.due to keep the steady share within the budget.
    budget_action: str = _choice("report")
    console: bool = True
    log_every: int = 10
    # With log_every left at its default, the fast line at most once per this many seconds:
    # a 1 ms step would otherwise print 100 lines a second. An explicit log_every is what the
    # user asked to read, so it has no floor unless this is set too
    # (derived/console.py fast_log_min_interval_seconds). 0: every log_every steps.
    # Breakdowns and slow-step lines are never held back.
    console_min_interval_seconds: float = 1.0
    # None disables the endpoint, 0 picks a free port; DEFAULT is 9464 + local rank.
    prometheus_port: int | None = DEFAULT
    prometheus_host: str = "127.0.0.1"
    shutdown_timeout_seconds: float = 2.0
    status_dir: str | None = None
    exporter: str | None = _choice(None)
    otlp_endpoint: str | None = None
    otlp_protocol: str | None = _choice(None)
    spans_path: str | None = None
    # The local span file (OTLP JSON lines): rotation size, total cap (None: no cap), and
    # compression (gzip by default: ~190 bytes per step instead of ~3.6 KB, measured).
    spans_file_max_bytes: int = 256 * 1024 * 1024
    spans_total_max_bytes: int | None = None
    spans_compression: str = _choice("gzip")
    # The HTML report written at shutdown (report.html in the status dir); None: on when
    # the console is on.
    report: bool | None = None
    recent_window_steps: int = 100
    # A step is slow when its training time (monitoring excluded) is over factor x the
    # rolling median of its loader's training times (and far outside their spread).
    slow_step_factor: float = 2.5
    slow_step_seconds: float | None = None
    # -- profiling (pipeline/profile_capture.py) -----------------------------------------------
    # After a slow step, the next K steps run under torch.profiler (0: never); at most one
    # such capture per profile_min_interval_seconds. run.profile_next(k) asks by hand.
    profile_on_slow_steps: int = 0
    profile_min_interval_seconds: float = 600.0
    # The first N steps (compilation, caches, allocator) are warm-up: reported apart, out
    # of the slow-step baseline and of the steady-state figures the budget and advisor use.
    warmup_steps: int = DEFAULT_WARMUP_STEPS
    # The console's full breakdown prints on steps whose monitoring is at least this share
    # of the step, or that ran one of eval_operations; other steps get the fast line only.
    console_breakdown_min_share: float = 0.05
    eval_operations: tuple[str, ...] = ()
    slow_operation_seconds: float = 30.0
    stall_seconds: float | None = None
    # When stall_seconds is None: a step is stalled after max(10 x typical step, this).
    stall_min_seconds: float = 300.0
    costs_interval_seconds: float = 10.0  # how often monitoring_costs.json is rewritten
    watchdog_interval_seconds: float = 1.0
    # -- stall evidence (derived/stall_stacks.py) --------------------------------------------
    # Every thread's stack into RUN_DIR/stalls/ on a stall; arms faulthandler's process-wide
    # later-timer on each watchdog check (False leaves an application's own timer alone).
    stall_stacks: bool = True
    # A signal ("SIGUSR1") that dumps every thread's stack into stalls/signal-rank<R>.txt.
    stall_stacks_signal: str | None = None
    gpu_sample_interval_seconds: float = 5.0
    max_queued_steps: int = 4096
    # "on": finished flat steps go from the hot path into a shared-memory ring
    # (recording/step_ring.py) instead of the queue; "off": every step is queued; "auto":
    # the ring where the exporter process reads it (pipeline/plan.py), the queue elsewhere.
    step_ring: str = _choice("auto")
    max_queued_spans: int = 16384
    # Spans per OTLP request (or span-file line): at ~1 ms steps a 512-span batch is ~10
    # POSTs a second at ~0.75 ms of CPU each; 2048 is a quarter of that, still ~0.5 MiB
    # a request, and a slower loop sends every export_interval_seconds anyway.
    export_batch_size: int = 2048
    export_interval_seconds: float = 1.0
    # OTLP requests are split to stay under this (a collector's gRPC default limit: 4 MiB).
    export_max_request_bytes: int = 4 * 1024 * 1024
    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None
    # -- scale-out ---------------------------------------------------------------------------
    # "prometheus" (endpoint), "otlp" (push), "prometheus,otlp", "none"; None: from
    # OTEL_METRICS_EXPORTER, else prometheus.
    metrics_exporter: str | None = _choice(None)
    # Share of ordinary steps whose spans are exported (by derived trace id, the same on
    # every rank); None: OTEL_TRACES_SAMPLER's ratio, else 1.0. Slow, failed, monitoring
    # and the first `sample_keep_first_steps` steps are always exported.
    sample_ratio: float | None = None
    sample_keep_first_steps: int = 10
    # Where the spans go: "own" (bounded, drop-counting export stage, also when the
    # application has an SDK TracerProvider: to its OTLP endpoint) or "application" (hand
    # the spans to the application's provider's processors).
    trace_export: str = _choice("own")
    # OTLP and span-file export run in a child process fed span records through a pipe
    # (export/process/): encoding and sending spans then never hold the training process's
    # GIL. False: the same records exported by a thread of the training process.
    export_process: bool = True
    # With the exporter process: the derived metrics (slow steps, overhead, budget, the
    # Prometheus histograms, the console) run there too; this process serves a copy of their
    # state, refreshed once a second (derived/chain.py). False: they run here.
    metrics_in_export_process: bool = True
    # The exporter process's niceness (added to this process's, 0..19): its CPU yields to
    # the training threads when they compete for a core.
    export_process_nice: int = 10
    # Where otel-train's background runs (common/cpu_affinity.py): auto keeps the exporter
    # process and the run's threads off the CPU the training thread starts on; off: anywhere.
    background_cpus: str = _choice("auto")  # auto | off
    # -- device busy/idle and memory (recording/device_probes.py) ----------------------------
    # Device events (device_sync=events) and allocator peaks on one step in N.
    device_events_every_steps: int = 10
    memory_peaks: str = _choice("auto")  # auto | on | off
    # The job envelope (derived/goodput.py): a train.startup span (process start -> the first
    # step) ahead of the first step. Goodput and the job's time by part are kept either way.
    startup_span: bool = False
    # -- at scale (common/export_ranks.py) ----------------------------------------------------
    # Which ranks export ordinary steps: auto (all up to 64 ranks, then first-per-node), all,
    # first-per-node, fraction:F, or ranks "0,8,16". The others still export slow, failed,
    # stalled and truncated steps, and keep their metrics.
    export_ranks: Any = _choice("auto")
    # "steps": each step's spans; "summary": one train.summary span per interval instead.
    span_mode: str = _choice("steps")
    summary_every_steps: int = 100
    summary_every_seconds: float = 60.0
    # "all": every metric carries rank; "gauges": the step and phase histograms drop it
    # (per-rank counters and gauges keep it: the straggler rules need them).
    metrics_rank_label: str = _choice("all")
    # -- throughput, FLOPs and MFU (recording/step_counts.py, derived/throughput.py) ----------
    # Tokens / samples per step: an int, or a callable taking the batch; None: from the
    # batch's shape where that is unambiguous (step.count(...) overrides per step).
    tokens_per_step: Any = field(default=None, metadata={"env": "optional_int"})
    samples_per_step: Any = field(default=None, metadata={"env": "optional_int"})
    # Count one early step's FLOPs under torch.utils.flop_counter.FlopCounterMode.
    count_flops: bool = False
    flops_per_step: float | None = None  # given instead of counted
    peak_flops_per_second: float | None = None  # None: the device table (common/device_peaks.py)
    # Where each value came from, for error messages: name -> "argument" | env var name.
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def resolve(
        cls, environ: Mapping[str, str] | None = None, **kwargs: Any
    ) -> RunOptions:
        """Merge keyword arguments over ``OTEL_TRAIN_*`` over defaults, then validate."""
        env = os.environ if environ is None else environ
        names = {f.name for f in dataclasses.fields(cls) if f.name != "sources"}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise ValueError(
                f"unknown option(s) {', '.join(unknown)}; known options: {', '.join(sorted(names))}"
            )
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for f in dataclasses.fields(cls):
            if f.name == "sources":
                continue
            if f.name in kwargs:
                values[f.name] = kwargs[f.name]
                sources[f.name] = "argument"
                continue
            var = ENV_PREFIX + f.name.upper()
            raw = env.get(var)
            if raw is not None:
                values[f.name] = _parse_env(f.name, var, raw.strip(), f.default)
                sources[f.name] = var
        opts = cls(**values, sources=sources)
        opts._validate()
        return opts

    def where(self, name: str) -> str:
        """How to name option ``name`` in an error: the env var it came from, or the option."""
        src = self.sources.get(name, "argument")
        return f"option {name!r}" if src == "argument" else f"option {name!r} (from {src})"

    def _fail(self, name: str, rule: str) -> None:
        raise ValueError(f"{self.where(name)}={getattr(self, name)!r}: {rule}")

    def _validate(self) -> None:
        """Every option's rule, at set-up: a ValueError naming the first option that breaks one."""
        self._validate_text_and_choices()
        self._validate_ratios()
        self._validate_integers()
        self._validate_seconds()
        self._validate_ranks()
        self._validate_scale_out()
        self._validate_profiling()
        self._validate_throughput()

    def _validate_text_and_choices(self) -> None:
        for name in ("service_name", "run_id", "status_dir", "spans_path", "otlp_endpoint"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v.strip()):
                self._fail(name, "must be a non-empty string or None")
        if self.device_sync not in _DEVICE_SYNC:
            self._fail("device_sync", f"must be one of {', '.join(_DEVICE_SYNC)}")
        if self.budget_action not in ("report", "govern"):
            self._fail("budget_action", "must be 'report' or 'govern'")
        if self.memory_peaks not in ("auto", "on", "off"):
            self._fail("memory_peaks", "must be one of auto, on, off")
        if self.step_ring not in ("auto", "on", "off"):
            self._fail("step_ring", "must be one of auto, on, off")
        if self.exporter is not None and self.exporter not in _EXPORTERS:
            self._fail("exporter", f"must be one of {', '.join(_EXPORTERS)} or None")
        if self.otlp_protocol is not None and self.otlp_protocol not in _PROTOCOLS:
            self._fail("otlp_protocol", f"must be one of {', '.join(_PROTOCOLS)} or None")
        if self.stall_stacks_signal is not None:
            try:
                catchable_signal(str(self.stall_stacks_signal))
            except ValueError:
                self._fail("stall_stacks_signal", "must be a signal name that can be caught "
                           "(SIGUSR1, SIGUSR2, SIGQUIT) or None")
        for name in ("console", "enabled", "stall_stacks", "startup_span"):
            if not isinstance(getattr(self, name), bool):
                self._fail(name, "must be True or False")
        if self.report is not None and not isinstance(self.report, bool):
            self._fail("report", "must be True, False or None (None: on with the console)")
        if self.spans_compression not in ("none", "gzip"):
            self._fail("spans_compression", "must be 'none' or 'gzip'")
        ops = self.eval_operations
        if isinstance(ops, str) or not isinstance(ops, (list, tuple, set, frozenset)) or not all(
                isinstance(o, str) and o.strip() for o in ops):
            self._fail("eval_operations",
                       "must be a list of monitoring operation names (non-empty strings)")
        object.__setattr__(self, "eval_operations", tuple(o.strip() for o in ops))

    def _validate_ratios(self) -> None:
        for name in ("budget", "critical"):
            v = getattr(self, name)
            if not _is_number(v) or not 0.0 < v < 1.0:
                self._fail(name, "must be a ratio strictly between 0 and 1 (0.05 means 5%)")
        if self.critical <= self.budget:
            raise ValueError(
                f"{self.where('critical')}={self.critical!r} must be greater than "
                f"{self.where('budget')}={self.budget!r}"
            )
        share = self.console_breakdown_min_share
        if not _is_number(share) or not 0.0 <= share <= 1.0:
            self._fail("console_breakdown_min_share",
                       "must be a ratio between 0 and 1 (0.05: monitoring >= 5% of the step)")

    def _validate_integers(self) -> None:
        v = self.export_max_request_bytes
        if not _is_int(v) or v < 65536:
            self._fail("export_max_request_bytes", "must be an integer >= 65536 (bytes)")
        v = self.spans_file_max_bytes
        if not _is_int(v) or v < 1:
            self._fail("spans_file_max_bytes", "must be an integer >= 1")
        v = self.spans_total_max_bytes
        if v is not None and (not _is_int(v) or v < self.spans_file_max_bytes):
            self._fail("spans_total_max_bytes", "must be None (no cap) or an integer >= "
                       f"spans_file_max_bytes ({self.spans_file_max_bytes})")
        for name in ("log_every", "recent_window_steps", "max_queued_steps", "max_queued_spans",
                     "export_batch_size", "device_events_every_steps"):
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                self._fail(name, "must be an integer >= 1")
        port = self.prometheus_port
        if port is not DEFAULT and port is not None:
            if not _is_int(port) or not 0 <= port <= 65535:
                self._fail("prometheus_port", "must be None (off), 0 (a free port) or 1..65535")
        if self.background_cpus not in ("auto", "off"):
            self._fail("background_cpus", "must be one of auto, off")
        v = self.export_process_nice
        if not _is_int(v) or not 0 <= v <= 19:
            self._fail("export_process_nice", "must be an integer from 0 (as the training "
                       "process) to 19 (the lowest priority)")
        if not _is_int(self.warmup_steps) or self.warmup_steps < 0:
            self._fail("warmup_steps", "must be an integer >= 0 (0: no warm-up)")

    def _validate_seconds(self) -> None:
        for name in ("shutdown_timeout_seconds", "slow_operation_seconds",
                     "watchdog_interval_seconds", "gpu_sample_interval_seconds",
                     "export_interval_seconds", "slow_step_factor", "stall_min_seconds",
                     "costs_interval_seconds"):
            v = getattr(self, name)
            if not _is_number(v) or not v > 0 or math.isinf(v):
                self._fail(name, "must be a finite number > 0")
        v = self.console_min_interval_seconds
        if not _is_number(v) or not v >= 0 or math.isinf(v):
            self._fail("console_min_interval_seconds",
                       "must be a finite number of seconds >= 0 (0: a line every log_every "
                       "steps)")
        if self.slow_step_factor <= 1.0:
            self._fail("slow_step_factor", "must be > 1 (a multiple of the rolling median)")
        for name in ("slow_step_seconds", "stall_seconds"):
            v = getattr(self, name)
            if v is not None and (not _is_number(v) or not v > 0):
                self._fail(name, "must be a number > 0 or None")

    def _validate_profiling(self) -> None:
        v = self.profile_on_slow_steps
        if not _is_int(v) or not 0 <= v <= 1000:
            self._fail("profile_on_slow_steps", "must be an integer from 0 (off) to 1000 (steps "
                       "profiled after a slow step)")
        v = self.profile_min_interval_seconds
        if not _is_number(v) or not v >= 0 or math.isinf(v):
            self._fail("profile_min_interval_seconds", "must be a finite number of seconds >= 0")

    def _validate_ranks(self) -> None:
        for name in ("rank", "world_size", "local_rank"):
            v = getattr(self, name)
            if v is not None and (not _is_int(v) or v < 0):
                self._fail(name, "must be an integer >= 0 or None")
        if self.world_size is not None and self.world_size < 1:
            self._fail("world_size", "must be >= 1")
        if (self.rank is not None and self.world_size is not None
                and self.rank >= self.world_size):
            self._fail("rank", f"must be < world_size ({self.world_size})")

    def _validate_scale_out(self) -> None:
        if self.metrics_exporter is not None:
            names = ([n.strip() for n in self.metrics_exporter.split(",")]
                     if isinstance(self.metrics_exporter, str) else [None])
            if not names or any(n not in _METRICS_EXPORTERS for n in names):
                self._fail("metrics_exporter", "must be prometheus, otlp, none, or a "
                           "comma-separated list of them (prometheus,otlp), or None")
        v = self.sample_ratio
        if v is not None and (not _is_number(v) or not 0.0 <= v <= 1.0):
            self._fail("sample_ratio", "must be a ratio from 0 to 1 (0.1 keeps 10% of the "
                       "ordinary steps) or None")
        v = self.sample_keep_first_steps
        if not _is_int(v) or v < 0:
            self._fail("sample_keep_first_steps", "must be an integer >= 0")
        if self.trace_export not in _TRACE_EXPORT:
            self._fail("trace_export", f"must be one of {', '.join(_TRACE_EXPORT)}")
        self._validate_at_scale()

    def _validate_at_scale(self) -> None:
        try:
            parse_export_ranks(self.export_ranks)
        except ValueError:
            self._fail("export_ranks", "must be auto, all, first-per-node, fraction:F (0 < F "
                       "<= 1), a rank, or a comma-separated list of ranks (0,8,16)")
        if self.span_mode not in SPAN_MODES:
            self._fail("span_mode", f"must be one of {', '.join(SPAN_MODES)}")
        if not _is_int(self.summary_every_steps) or self.summary_every_steps < 1:
            self._fail("summary_every_steps", "must be an integer >= 1")
        v = self.summary_every_seconds
        if not _is_number(v) or not v > 0 or math.isinf(v):
            self._fail("summary_every_seconds", "must be a finite number of seconds > 0")
        if self.metrics_rank_label not in _RANK_LABELS:
            self._fail("metrics_rank_label", f"must be one of {', '.join(_RANK_LABELS)}")

    def _validate_throughput(self) -> None:
        for name in ("tokens_per_step", "samples_per_step"):
            v = getattr(self, name)
            if v is not None and not callable(v) and (not _is_int(v) or v < 0):
                self._fail(name, "must be an integer >= 0, a callable taking the batch, or None "
                           "(from the batch's shape)")
        for name in ("flops_per_step", "peak_flops_per_second"):
            v = getattr(self, name)
            if v is not None and (not _is_number(v) or not v > 0 or math.isinf(v)):
                self._fail(name, "must be a finite number > 0 or None")


def catchable_signal(name: str) -> int:
    """The number of a signal named 'SIGUSR1' or 'USR1'; ValueError when it cannot be caught."""
    upper = name.upper()
    sig = getattr(signal, upper if upper.startswith("SIG") else "SIG" + upper, None)
    if not isinstance(sig, signal.Signals) or sig in (signal.SIGKILL, signal.SIGSTOP):
        raise ValueError(f"{name!r} is not a signal that can be caught")
    return int(sig)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _parse_env(name: str, var: str, raw: str, default: Any) -> Any:
    """Parse one ``OTEL_TRAIN_*`` value into the option's type; raise ValueError naming it."""
    kind = _ENV_KINDS.get(name, "str")
    low = raw.lower()
    try:
        if kind == "bool":
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError("expected true/false")
        if kind == "optional_bool":
            if low in ("", "auto", "default"):
                return None
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError("expected true/false/auto")
        if kind == "optional_float":
            return None if low in _NONE else float(raw)
        if kind == "optional_int":
            return None if low in _NONE else int(raw)
        if kind == "port":
            if low in _NONE:
                return None
            if low in ("default", "auto"):
                return DEFAULT
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "int":
            return int(raw)
        if kind == "optional_str":
            return None if low in _NONE else raw
        if kind == "names":  # comma-separated: "inference,val_loss"
            return tuple(n.strip() for n in raw.split(",") if n.strip())
        if kind == "choice":  # 'none' is a value here (exporter=none), only '' means unset
            return None if low == "" else low
        return raw
    except ValueError:
        raise ValueError(
            f"option {name!r} (from {var})={raw!r}: cannot be read as {kind.replace('_', ' ')}"
        ) from None


# How an OTEL_TRAIN_<NAME> string becomes each option's type: derived from the annotations,
# so a new option is read from the environment the day it is declared.
_KIND_BY_ANNOTATION = {
    "bool": "bool", "bool | None": "optional_bool", "int": "int", "int | None": "optional_int",
    "float": "float", "float | None": "optional_float", "str": "str",
    "str | None": "optional_str", "tuple[str, ...]": "names",
}


def _env_kinds() -> dict[str, str]:
    kinds = {}
    for f in dataclasses.fields(RunOptions):
        if f.name == "sources":
            continue
        if f.default is DEFAULT:
            kinds[f.name] = "port"  # None: off, "default": the computed default, or a number
        else:
            kinds[f.name] = f.metadata.get("env") or _KIND_BY_ANNOTATION[str(f.type)]
    return kinds


_ENV_KINDS = _env_kinds()
