"""The options reference page, docs/options.md, rendered from ``RunOptions``.

Each option's name, default and ``OTEL_TRAIN_<NAME>`` variable come from the dataclass; its
explanation comes from ``OPTION_DOCS`` below, keyed by field name. Rendering fails when a
field has no entry or an entry names no field, so the page cannot drift from the code.

Usage::

    python -m otel_train.common.options_doc > docs/options.md
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

from otel_train.common import options as options_module
from otel_train.common.options import DEFAULT, DEFAULT_PROMETHEUS_PORT, ENV_PREFIX, RunOptions


@dataclass(frozen=True)
class OptionDoc:
    """One option's entry on the page: its section, a one-line meaning, and optional notes."""

    section: str
    meaning: str
    # What an unset option (a None or marker default) resolves to.
    when_unset: str | None = None
    # A paragraph under the tables, for options whose behaviour needs more than a line.
    details: str | None = None


# (key, heading), in page order.
SECTIONS: tuple[tuple[str, str], ...] = (
    ("run", "The run"),
    ("budget", "Budget, warm-up, slow steps and stalls"),
    ("console", "Console, report and background intervals"),
    ("metrics", "Metrics"),
    ("export", "Spans and export"),
    ("sampling", "Sampling"),
    ("throughput", "Throughput, FLOPs and MFU"),
)

OPTION_DOCS: dict[str, OptionDoc] = {
    # -- the run
    "enabled": OptionDoc(
        "run", "`False`: the API works and records nothing: no thread, socket or file, no "
        "device sync, torch not imported", "`False` when `OTEL_SDK_DISABLED=true`"),
    "service_name": OptionDoc("run", "resource `service.name`",
                              "`OTEL_SERVICE_NAME`, else `otel-train`"),
    "run_id": OptionDoc(
        "run", "shared by all ranks; step N's trace id derives from (run id, N)",
        "from the launcher (torchrun, Slurm, Kubernetes: see [scaling.md](scaling.md)), "
        "else generated"),
    "rank": OptionDoc("run", "this process's rank",
                      "`torch.distributed`, else `RANK`, else `SLURM_PROCID` under `srun`, else 0"),
    "world_size": OptionDoc("run", "number of ranks in the run",
                            "`torch.distributed`, else `WORLD_SIZE`, else Slurm's task count, "
                            "else 1"),
    "local_rank": OptionDoc("run", "rank on this host (the default metrics port adds it)",
                            "`LOCAL_RANK`, else `SLURM_LOCALID` under `srun`, else 0"),
    "status_dir": OptionDoc(
        "run", "the run directory: span files, `monitoring_costs.json`, `report.html`",
        "`otel-train-runs/<run id>`"),
    "device_sync": OptionDoc(
        "run", "`monitor_sync`: training phases on the host clock with device time from "
        "events (1 step in `device_events_every_steps`), the accelerator synchronized only at "
        "the start and end of monitoring (`step.monitor`, `run.monitor`); `sync`: at every "
        "phase boundary (exact per-phase attribution; its waits are reported as own cost); "
        "`events`: device events only, no synchronize anywhere; `off`: host clock only; "
        "`auto`: `monitor_sync` when an accelerator is present, else the host clock; "
        "synchronizing starts at the process's first use of the device, not before "
        "([device-timing.md](device-timing.md))"),
    "shutdown_timeout_seconds": OptionDoc(
        "run", "bound on shutdown and on interpreter exit (less a reserve for the "
        "interpreter's own teardown)"),
    # -- budget, slow steps, stalls
    "budget": OptionDoc("budget", "monitoring overhead warning threshold (monitoring time / "
                        "training time, judged on the steady state)"),
    "critical": OptionDoc("budget", "monitoring overhead critical threshold; must be above "
                          "`budget`"),
    "budget_action": OptionDoc(
        "budget", "`report` (measure, warn, advise) or `govern` (also stretch the intervals "
        "of operations scheduled with `step.due`)",
        details="With `budget_action=\"govern\"`, `step.due(operation, every=N)` runs each "
        "operation at an interval that keeps the steady monitoring share at 90% of `budget`, "
        "within `min_every`..`max_every` (default `every`..20 x `every`), the same on every "
        "rank; see [governor.md](governor.md)."),
    "warmup_steps": OptionDoc("budget", "the first N steps are warm-up: marked, out of the "
                              "slow-step baseline and of the steady-state figures"),
    "recent_window_steps": OptionDoc("budget", "steps in the `recent` overhead window"),
    "slow_step_factor": OptionDoc(
        "budget", "a step whose training time (monitoring excluded) is over this factor x its "
        "loader's rolling median, far outside their spread, and at least 1 ms over the median "
        "is slow (a step under 1 ms never is, on ratio alone)"),
    "slow_step_seconds": OptionDoc("budget", "a step whose training time is over this many "
                                   "seconds is slow too", "off"),
    "slow_operation_seconds": OptionDoc("budget", "one monitoring call longer than this warns"),
    "profile_on_slow_steps": OptionDoc(
        "budget", "after a slow step, profile the next this many steps under `torch.profiler` "
        "(`0`: never)", details=(
            "The trace goes to `profiles/step-<first>-<last>.json` in the run directory "
            "(Chrome/Perfetto, with each step's trace id), and each profiled step gets a "
            "`train.profile` child span whose `train.profile.op` events are its top operators "
            "by self time (docs/telemetry.md). The capture starts at the step boundary after "
            "the slow-step verdict reaches the training process (within about a second when "
            "the derived metrics run in the exporter process). Only `run.steps` loops and "
            "`run.step()` check it; with this at `0` and no `run.profile_next` call, neither "
            "checks anything and `torch.profiler` is never imported.")),
    "profile_min_interval_seconds": OptionDoc(
        "budget", "at most one slow-step profile per this many seconds (`run.profile_next` "
        "is not limited)"),
    "stall_seconds": OptionDoc("budget", "a step running longer than this is a stall",
                               "10 x the median step, at least `stall_min_seconds`"),
    "stall_min_seconds": OptionDoc("budget", "the least stall threshold when `stall_seconds` "
                                   "is unset"),
    "stall_stacks": OptionDoc(
        "budget", "on a stall, every thread's stack into `RUN_DIR/stalls/` (also while the "
        "training thread holds the GIL: arms faulthandler's process-wide later-timer on each "
        "watchdog check; turn off if your code arms its own); see docs/stalls.md"),
    "stall_stacks_signal": OptionDoc(
        "budget", "a signal (`SIGUSR1`) that writes every thread's stack into "
        "`stalls/signal-rank<R>.txt` (faulthandler, chained to a handler already there)",
        "off"),
    # -- console, report, background intervals
    "console": OptionDoc("console", "start-up banner and console timing reports; off, slow "
                         "steps are counted and said in a few summary lines, not one by one"),
    "log_every": OptionDoc("console", "console fast-log interval, in steps; set explicitly "
                           "(argument or env), every `log_every`-th step gets its line"),
    "console_min_interval_seconds": OptionDoc(
        "console", "with `log_every` left at its default: at most one routine fast-log line "
        "per this many seconds (step end times); an explicit `log_every` has no such floor "
        "unless this is set too; slow-step lines and breakdowns are never held back; `0`: "
        "every `log_every` steps"),
    "console_breakdown_min_share": OptionDoc(
        "console", "the full breakdown prints on steps whose monitoring is at least this share "
        "of the step (`0`: any monitoring)"),
    "eval_operations": OptionDoc(
        "console", "monitoring operations that always get the full breakdown (env: "
        "comma-separated, `inference,val_loss`)", "none"),
    "report": OptionDoc("console", "write `report.html` at shutdown (rank 0; needs the "
                        "`report` extra)", "on when `console` is"),
    "costs_interval_seconds": OptionDoc("console", "how often `monitoring_costs.json` is "
                                        "rewritten"),
    "watchdog_interval_seconds": OptionDoc("console", "how often the watchdog looks for "
                                           "stalls and monitoring calls running too long"),
    "gpu_sample_interval_seconds": OptionDoc(
        "console", "NVML sampling period (no NVML or no GPU: one info line, no thread)"),
    # -- metrics
    "prometheus_port": OptionDoc(
        "metrics", "port of the `/metrics` endpoint. The default port, when taken, moves to "
        "the next free one with one warning naming it; an explicit port that is taken raises; "
        "`None` disables the endpoint, `0` picks a free port (`run.prometheus_url`)",
        f"`{DEFAULT_PROMETHEUS_PORT}` + local rank"),
    "prometheus_host": OptionDoc("metrics", "bind address of the metrics endpoint"),
    "metrics_exporter": OptionDoc(
        "metrics", "`prometheus` (the endpoint), `otlp` (push through the OTel metrics SDK; "
        "the endpoint then only if `prometheus_port` is given), `prometheus,otlp`, `none`. "
        "`OTEL_METRIC_EXPORT_INTERVAL`, `OTEL_EXPORTER_OTLP_METRICS_*` and the temporality "
        "preference are honoured", "`OTEL_METRICS_EXPORTER`, else `prometheus`"),
    # -- spans and export
    "exporter": OptionDoc(
        "export", "`otlp`, `jsonl` (the span file: OTLP JSON lines), `console`, `none`; "
        "`auto`: as unset",
        "`OTEL_TRACES_EXPORTER`, else `otlp` if an endpoint is set, else `jsonl`"),
    "otlp_endpoint": OptionDoc("export", "OTLP endpoint", "`OTEL_EXPORTER_OTLP_ENDPOINT`"),
    "otlp_protocol": OptionDoc("export", "`grpc` or `http/protobuf` (the OTLP default)",
                               "`OTEL_EXPORTER_OTLP_PROTOCOL`"),
    "spans_path": OptionDoc("export", "the span file, used as named (`.gz`: gzip)",
                            "`<status_dir>/spans.jsonl.gz` (`spans-rank<N>...` per rank)"),
    "spans_compression": OptionDoc("export", "`gzip` or `none`"),
    "spans_file_max_bytes": OptionDoc("export", "rotate the span file at this size"),
    "spans_total_max_bytes": OptionDoc("export", "remove the oldest span files beyond this "
                                       "total (logged and counted)", "no cap"),
    "max_queued_steps": OptionDoc("export", "steps waiting for the background; overflow is "
                                  "counted in `otel_train_spans_dropped_total`"),
    "max_queued_spans": OptionDoc("export", "spans waiting for export; the queue drops its "
                                  "oldest spans first, counted"),
    "export_batch_size": OptionDoc(
        "export", "spans per OTLP request (or span-file line)",
        details="Larger than the SDK's 512: a ~1 ms step makes ~5,000 spans a second and each "
        "request has a fixed CPU cost whatever it carries ([benchmarks.md](benchmarks.md)), so "
        "2048 sends a quarter as many requests (~0.5 MiB each)."),
    "export_interval_seconds": OptionDoc("export", "the longest a span waits to go out"),
    "export_max_request_bytes": OptionDoc(
        "export", "OTLP requests are split to stay under it (a collector's default gRPC limit "
        "is 4 MiB)"),
    "export_process": OptionDoc(
        "export", "OTLP and span-file export run in a small exporter process started and "
        "stopped with the run; `False`: an export thread in the training process",
        details="The training process only hands the exporter process compact span records "
        "through a pipe, so building spans and encoding OTLP never hold its GIL. Same bounds, "
        "retries and drop counts; its log lines come back through the `otel_train` logger; it "
        "ignores the launcher's SIGINT/SIGTERM (the run's shutdown flushes through it) and "
        "leaves when the run ends or the training process dies; if it cannot start, export "
        "falls back to a thread."),
    "step_ring": OptionDoc(
        "export", "`auto` (the default): the hot path writes each finished flat step into a "
        "shared-memory ring read by the exporter process where the plan puts the exporter "
        "process and the derived metrics there, else queues it; `on`: the ring on every plan; "
        "`off`: every step is queued",
        details="A flat step (phases one after another, none failed) with root attribute "
        "values that are numbers, booleans or short strings is written as a compact record "
        "at its end (in C where the accelerator was built); any other step, and `run.monitor` "
        "records, are queued as before, a marker in the ring holding their place. A full "
        "ring drops the newest step, counted as `step_ring_full`. With the exporter process "
        "as the route and the derived metrics there, the exporter process reads the ring "
        "and builds the steps' spans: the training process does nothing per flat step after "
        "the hot path. On any other plan `auto` queues every step (read by the span worker "
        "of the training process the ring costs no less than the queue) and `on` has the "
        "span worker read the ring (`otel-train plan` says which)."),
    "export_process_nice": OptionDoc(
        "export", "with `export_process`: the exporter process's niceness, added to the "
        "training process's (0..19; 0: the same priority)",
        details="Niced, its CPU yields to the training threads when both want a core, so on "
        "a busy machine the exporter process takes its time rather than the training "
        "loop's; spans wait a little longer in its bounded queue. The default is the one "
        "that measured lowest in the all-in A/B (docs/benchmarks.md)."),
    "background_cpus": OptionDoc(
        "export", "where otel-train's background runs: `auto` keeps the exporter process and "
        "the run's threads off the CPU the training thread starts on; `off`: wherever the "
        "scheduler puts them",
        details="otel-train's background works in bursts; left to the scheduler, a burst can "
        "take the CPU the training thread has just left to wait for the GIL, and the "
        "training thread comes back to a core whose caches hold the background's code and "
        "data. With `auto` the background may use every CPU the process may use but that "
        "one; the training thread, torch's threads and the data loader's workers are never "
        "pinned. Nothing is done where the process may use one CPU only. `auto` measured below "
        "`off` in both all-in A/B runs on a 2-vCPU VM, by less than their intervals "
        "(docs/benchmarks.md)."),
    "metrics_in_export_process": OptionDoc(
        "export", "with `export_process`: the derived metrics run in the exporter process "
        "too; `False`: they always run in the training process",
        details="The derived metrics are slow steps, overhead, budget, the Prometheus "
        "histograms and counters and the console report. In the exporter process they leave "
        "the training process's background only turning steps into span records. The training "
        "process keeps a copy of their state, refreshed every second and before `run.costs()`, "
        "flushes and shutdown, and serves `/metrics`, `run.costs()`, `monitoring_costs.json` "
        "and the stall watchdog from it. Console lines and warnings come back to its "
        "`sys.stderr` and `otel_train` logger. If the exporter process dies, the copy goes on "
        "from its last state. With `sample_ratio` the tail decision runs there too, after them "
        "(user spans wait there for their step; if the exporter process dies or is not up by "
        "the end of a short run, the training process's copy of the chain decides from then "
        "on, as `export_ranks` and summary mode do). With metrics over OTLP, or an SDK "
        "sampler that drops steps, they stay in the training process."),
    "trace_export": OptionDoc(
        "export", "with an application's own `TracerProvider`: `own` export stage sending to "
        "its endpoint, or `application` (hand the spans to its processors)"),
    # -- sampling
    "sample_ratio": OptionDoc(
        "sampling", "share of ordinary steps exported, chosen by trace id, so every rank keeps "
        "the same steps. Slow, failed, monitoring and the first steps are always kept. Metrics "
        "still count every step; left-out spans are counted in "
        "`otel_train_spans_sampled_out_total`, not as drops",
        "`OTEL_TRACES_SAMPLER=traceidratio` + `_ARG`, else every step"),
    "sample_keep_first_steps": OptionDoc("sampling", "the first steps are always kept "
                                         "(start-up, compilation)"),
    # -- device busy/idle and memory
    "device_events_every_steps": OptionDoc(
        "run", "device events (`device_sync` `events`, `monitor_sync` and so `auto` on an "
        "accelerator) and allocator peaks (`memory_peaks`) are "
        "recorded on one step in N (steps whose index is a multiple of N); 1: every step",
        details="Each sampled step records one event and one allocator reading per phase "
        "boundary on the training thread (no sync) and resolves them in the background into "
        "`train.device.busy_seconds`, `train.device.idle_seconds` and "
        "`train.memory.peak_*_bytes` ([device-timing.md](device-timing.md)). Host RSS is read "
        "on the same steps, in the background."),
    "memory_peaks": OptionDoc(
        "run", "peak allocated/reserved bytes per phase from the accelerator's allocator "
        "(reset at phase start, read at its end, no sync) where it keeps statistics (CUDA, "
        "and others through `torch.accelerator`), and the host RSS on the root span (CPU's "
        "only memory figure): `on`; `auto`: the same, but no allocator peaks with "
        "`device_sync=off` (which keeps the C phases); `off`: neither"),
    # -- the job envelope
    "startup_span": OptionDoc(
        "export", "a `train.startup` span from the process's start to the first step "
        "(children: `before_start_run`, `start_run`, `to_first_step`), with `train.attempt` "
        "and, on a resumed run, the previous attempt's link",
        details="Goodput, `otel_train_job_seconds_total{part=\"startup\"}` and the costs' "
        "`envelope` count the start-up either way (docs/telemetry.md, \"The job envelope\")."),
    # -- at scale (common/export_ranks.py, derived/step_summary.py) --
    "export_ranks": OptionDoc(
        "sampling", "which ranks export their ordinary steps: `auto`, `all`, "
        "`first-per-node`, `fraction:F`, or ranks `0,8,16`",
        details="`auto`: `all` up to 64 ranks, `first-per-node` (local rank 0) above, said "
        "once in the start-up lines (64 ranks x 100 steps/s = 8.6 MB/s of spans, under "
        "Tempo's default 15 MB/s per tenant: docs/scaling.md). `fraction:F` picks ranks by a "
        "stable hash of the rank number (the same ranks every restart), rank 0 always. The "
        "other ranks still export their slow, failed, stalled and truncated steps (root and "
        "phases), run their derived metrics and serve `/metrics`; step N is one trace across "
        "the ranks that export it."),
    "span_mode": OptionDoc(
        "sampling", "`steps`: each step's spans; `summary`: one `train.summary` span per "
        "interval from each exporting rank instead",
        details="A summary carries count, sum, min, max, p50 and p99 seconds per phase and "
        "for the step, the step range and the slow and failed step numbers; those steps are "
        "exported in full. `otel-train report` and `otel-train export` read them "
        "(docs/telemetry.md)."),
    "summary_every_steps": OptionDoc("sampling", "summary mode: a summary every this many "
                                     "steps (it bounds the durations held for percentiles)"),
    "summary_every_seconds": OptionDoc("sampling", "summary mode: a summary at the first step "
                                       "this long after its interval began"),
    "metrics_rank_label": OptionDoc(
        "metrics", "`all`: every metric carries `rank`; `gauges`: the step and phase "
        "histograms drop it, per-rank counters and gauges keep it",
        details="Bounded series for large jobs (docs/scaling.md); the straggler and overhead "
        "rules take a histogram's rank from `otel_train_steps_total` of the same target."),
    # -- throughput, FLOPs and MFU
    "tokens_per_step": OptionDoc(
        "throughput", "tokens a step trains on: an integer, or a callable taking the batch "
        "(`step.count(tokens=...)` wins per step)",
        "from the batch's shape: a 2-D integer tensor, or a dict's `input_ids`, counts "
        "`numel()` (padding included); otherwise not counted",
        details="Only shapes are read, never a value: no device sync. A batch whose size is "
        "ambiguous (not a tensor, a dict without `input_ids`, or a tuple whose tensors differ "
        "in their first dimension) logs one hint and is no longer inspected. An integer costs "
        "nothing per step (the background fills it in). Environment variables take an "
        "integer only (docs/telemetry.md, Throughput)."),
    "samples_per_step": OptionDoc(
        "throughput", "samples a step trains on: an integer, or a callable taking the batch",
        "from the batch's shape: the first dimension of a tensor, of a dict's `input_ids`, "
        "or of a tuple's first tensor"),
    "count_flops": OptionDoc(
        "throughput", "count step 1's FLOPs under `torch.utils.flop_counter.FlopCounterMode` "
        "(then MFU, with a peak)",
        details="Step 1 runs under the counter from just after its fetch to the start of "
        "step 2, is marked `train.flops.counted` and left out of the slow-step baseline and "
        "of FLOP/s and MFU (with `warmup_steps` >= 2, the default 5, it is also warm-up, out "
        "of the steady-state overhead); step 2 carries the count, the matmuls' dtype and the device's peak. "
        "The first counted step in a process also imports `torch._dynamo` (seconds, once). "
        "Later steps' FLOPs scale with their tokens."),
    "flops_per_step": OptionDoc("throughput", "FLOPs of one step, given instead of counted",
                                "counted with `count_flops`, else none (no FLOP/s, no MFU)"),
    "peak_flops_per_second": OptionDoc(
        "throughput", "the device's peak FLOP/s that MFU divides by",
        "the table of common accelerators by dtype (`otel_train/common/device_peaks.py`); "
        "none on a CPU"),
}

# How each OTEL_TRAIN_<NAME> string is read, by the parse kind options.py derives per field.
ENV_FORMS: dict[str, str] = {
    "bool": "`true`/`false`",
    "optional_bool": "`true`/`false`/`auto`",
    "int": "integer",
    "optional_int": "integer or `none`",
    "float": "number",
    "optional_float": "number or `none`",
    "str": "string",
    "optional_str": "string or `none`",
    "names": "comma-separated names",
    "choice": "one of the names under *meaning*",
    "port": "port, `none` or `default`",
}

_HEADER = """\
# Options

<!-- Generated by `python -m otel_train.common.options_doc > docs/options.md` from
otel_train/common/options.py; edit the descriptions in otel_train/common/options_doc.py. -->

Every option is a keyword argument of `otel_train.start_run` and is also read from
`OTEL_TRAIN_<NAME>`; the argument wins over the variable, the variable over the default. A bad
value raises `ValueError` at `start_run` naming the option, where it came from, and the rule.
Booleans read from the environment accept `1/0`, `true/false`, `yes/no`, `on/off`; `none`
(or an empty value) unsets an option whose default is `None`.
"""

_FOOTER = """\
## The standard OpenTelemetry variables

They work as the OpenTelemetry SDK documents them: `OTEL_SERVICE_NAME`,
`OTEL_RESOURCE_ATTRIBUTES`, `OTEL_EXPORTER_OTLP_ENDPOINT` / `_PROTOCOL` / `_HEADERS` /
`_TIMEOUT` (and their `_TRACES_` forms), `OTEL_TRACES_SAMPLER` / `_ARG`, `OTEL_TRACES_EXPORTER`,
`OTEL_METRICS_EXPORTER`, `OTEL_SDK_DISABLED`, and the attribute limits
`OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`, `OTEL_ATTRIBUTE_COUNT_LIMIT` (and their `OTEL_SPAN_`
forms). A malformed value warns once and falls back to the default.

If your application already installed an SDK `TracerProvider` with an OTLP exporter, otel-train
sends its spans through its own bounded export stage to that exporter's endpoint (with its
headers and TLS; `trace_export="application"` hands them to the application's pipeline
instead); otherwise it installs its own global provider.
"""


def check_option_docs() -> None:
    """Raise ValueError unless OPTION_DOCS describes exactly the fields of RunOptions."""
    fields = {f.name for f in dataclasses.fields(RunOptions) if f.name != "sources"}
    missing = sorted(fields - set(OPTION_DOCS))
    unknown = sorted(set(OPTION_DOCS) - fields)
    sections = {key for key, _ in SECTIONS}
    misplaced = sorted(n for n, d in OPTION_DOCS.items() if d.section not in sections)
    if missing or unknown or misplaced:
        raise ValueError(
            "OPTION_DOCS must describe every RunOptions field and nothing else: "
            f"no description for {missing}, no field for {unknown}, "
            f"unknown section for {misplaced}")


def env_var(name: str) -> str:
    """The environment variable an option is read from."""
    return ENV_PREFIX + name.upper()


def default_text(field: dataclasses.Field) -> str:
    """A field's default as the page shows it: the literal, and what an unset one resolves to."""
    doc = OPTION_DOCS[field.name]
    if field.default is DEFAULT:
        literal = "`DEFAULT`"
    elif isinstance(field.default, int) and not isinstance(field.default, bool) \
            and field.name.endswith("_bytes"):
        literal = f"`{field.default!r}` ({field.default / 2**20:g} MiB)"
    else:
        literal = f"`{field.default!r}`"
    return f"{literal}: {doc.when_unset}" if doc.when_unset else literal


def _row(field: dataclasses.Field) -> str:
    kind = options_module._ENV_KINDS[field.name]
    cells = (f"`{field.name}`", f"`{env_var(field.name)}`", default_text(field),
             ENV_FORMS[kind], OPTION_DOCS[field.name].meaning)
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def render_options_page() -> str:
    """The whole of docs/options.md."""
    check_option_docs()
    fields = [f for f in dataclasses.fields(RunOptions) if f.name != "sources"]
    parts = [_HEADER]
    for key, heading in SECTIONS:
        rows = [_row(f) for f in fields if OPTION_DOCS[f.name].section == key]
        details = [f"**`{f.name}`.** {OPTION_DOCS[f.name].details}" for f in fields
                   if OPTION_DOCS[f.name].section == key and OPTION_DOCS[f.name].details]
        parts.append(f"## {heading}\n\n| option | variable | default | variable's value | "
                     "meaning |\n| --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n")
        parts.extend(d + "\n" for d in details)
    parts.append(_FOOTER)
    return "\n".join(parts)


def main() -> int:
    """Print the page (``> docs/options.md`` to regenerate it)."""
    sys.stdout.write(render_options_page())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
