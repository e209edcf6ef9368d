"""The telemetry contract's names: span names, span attributes and metric names.

Dashboards, alert rules and tests depend on these exact strings (see docs/architecture.md). Extend,
never rename.
"""

from __future__ import annotations

# Span names
STEP_SPAN_NAME = "train.step"
PHASE_DATA = "data"
PHASE_FORWARD = "forward"
PHASE_BACKWARD = "backward"
PHASE_OPTIMIZER = "optimizer"
PHASE_INFERENCE = "inference"
PHASE_VAL_LOSS = "val_loss"
# Phases the integrations name (extensions)
PHASE_MICRO_STEP = "micro_step"  # one gradient-accumulation micro-batch (train.micro_step)
PHASE_EVAL = "eval"  # monitoring: model.eval() .. model.train() under instrument()
PHASE_LOG = "log"  # monitoring: the HF Trainer computing and emitting logs
PHASE_CHECKPOINT = "checkpoint"  # monitoring: the HF Trainer saving a checkpoint

# Span attributes
RUN_ID = "train.run.id"
STEP = "train.step"
RANK = "train.rank"
WORLD_SIZE = "train.world_size"
PHASE = "train.phase"
PHASE_KIND = "train.phase.kind"  # "train" | "monitor"
DATALOADER = "train.dataloader"  # on "data" spans only (the loader that fetch read)
SLOW = "train.slow"  # on the root span
DEVICE_SYNCED = "train.device.synced"  # True when a device synchronize bracketed the span
# Extensions (not renaming anything above)
# "sync" (a synchronize bracketed the span: its time includes its device work), "events"
# (device time from events on the span: duration/busy seconds), "host" (host clock only).
DEVICE_TIMING = "train.device.timing"
# monitor_sync: on a monitoring span, how long the synchronize at its start waited for the
# work queued before it (the step's training work: in the step, outside this span).
DEVICE_QUEUED_WAIT = "train.device.queued_wait_seconds"
DEVICE_TYPE = "train.device.type"  # "cpu", "cuda", "mps", ... : which clock the time reflects
DEVICE_DURATION = "train.device.duration_seconds"  # events mode: device time of the span
MICRO_STEP = "train.micro_step"  # gradient-accumulation micro-step index (integrations)
GPU_UTILIZATION = "train.gpu.utilization_ratio"  # NVML sample overlapping the step (max over GPUs)
GPU_MEMORY_USED = "train.gpu.memory_used_bytes"
# A span cut off (step or phase still open when the run ended): its end is the cut.
TRUNCATED = "train.truncated"  # True, on the root span and on each phase open at the cut
TRUNCATED_REASON = "train.truncated.reason"  # shutdown | sigterm | sigint | exception
TRUNCATED_SHUTDOWN = "shutdown"  # run.shutdown() / interpreter exit with a step open
TRUNCATED_EXCEPTION = "exception"  # an exception escaped the loop (or the interpreter)
TRUNCATED_SIGINT = "sigint"  # KeyboardInterrupt escaped the loop
# A profile of steps under torch.profiler (profile_on_slow_steps, run.profile_next)
PROFILE_SPAN_NAME = "train.profile"  # child of a profiled step's root span
PROFILE_FILE = "train.profile.file"  # the trace file, relative to the run directory
PROFILE_TRIGGER = "train.profile.trigger"  # "slow_step" | "request"
PROFILE_OP_EVENT = "train.profile.op"  # one event per top operator of the step
PROFILE_OP_NAME = "train.profile.op.name"
PROFILE_OP_SELF_SECONDS = "train.profile.op.self_seconds"  # CPU self time in the step
PROFILE_OP_DEVICE_SECONDS = "train.profile.op.device_self_seconds"  # CUDA, when profiled
PROFILE_OP_CALLS = "train.profile.op.calls"
# Communication per step (collectives timed by otel_train.instrument_ddp / instrument_collectives)
COMM_COUNT = "train.comm.count"  # root: collectives the step issued
COMM_BYTES = "train.comm.bytes"  # root: their payload bytes (DDP: the gradient buckets)
COMM_SECONDS = "train.comm.seconds"  # root: summed issue-to-completion time
COMM_EXPOSED_SECONDS = "train.comm.exposed_seconds"  # root: time the step waited on them
OWN_WORK_SECONDS = "train.own_work_seconds"  # root: training time minus that wait
COMM_EVENT = "train.comm"  # root span event, one per collective op of the step
COMM_OP = "train.comm.op"  # on that event: all_reduce, broadcast, ...

KIND_TRAIN = "train"
KIND_MONITOR = "monitor"

INSTRUMENTATION_SCOPE = "otel_train"

# Prometheus metric names (prefix otel_train_, base units, ratios 0..1)
METRIC_STEP_DURATION = "otel_train_step_duration_seconds"
METRIC_PHASE_DURATION = "otel_train_phase_duration_seconds"
METRIC_MONITORING_OVERHEAD = "otel_train_monitoring_overhead_ratio"
METRIC_OPERATION_OVERHEAD = "otel_train_operation_overhead_ratio"
METRIC_BUDGET = "otel_train_monitoring_budget_ratio"
METRIC_MONITORING_INTERVAL = "otel_train_monitoring_interval_steps"  # label operation (step.due)
METRIC_STEPS = "otel_train_steps_total"
METRIC_SLOW_STEPS = "otel_train_slow_steps_total"
METRIC_LAST_STEP_TIMESTAMP = "otel_train_last_step_timestamp_seconds"
METRIC_STEP_IN_PROGRESS = "otel_train_step_in_progress_seconds"
METRIC_SPANS_DROPPED = "otel_train_spans_dropped_total"
METRIC_INSTRUMENTATION_OVERHEAD = "otel_train_instrumentation_overhead_ratio"
METRIC_GPU_UTILIZATION = "otel_train_gpu_utilization_ratio"
METRIC_GPU_MEMORY_USED = "otel_train_gpu_memory_used_bytes"
# Device busy vs idle, the step's bound, peak memory per phase (device_probes.py)
DEVICE_BUSY = "train.device.busy_seconds"  # phase: device time between its events; root: sum
DEVICE_IDLE = "train.device.idle_seconds"  # data phase: device idle for input; root: wall - busy
STEP_BOUND = "train.step.bound"  # input, compute, communication, host (device_readings.py)
BOUND_INPUT, BOUND_COMPUTE, BOUND_COMM, BOUND_HOST = "input", "compute", "communication", "host"
COMM_EXPOSED = "train.comm.exposed_seconds"  # root, set by the communication timing (read here)
MEMORY_PEAK_ALLOCATED = "train.memory.peak_allocated_bytes"  # phase: allocator peak inside it
MEMORY_PEAK_RESERVED = "train.memory.peak_reserved_bytes"
HOST_RSS = "train.memory.host_rss_bytes"  # root, one step in device_events_every_steps
METRIC_PHASE_DEVICE_BUSY = "otel_train_phase_device_busy_seconds_total"
METRIC_DEVICE_IDLE = "otel_train_device_idle_seconds_total"
METRIC_STEPS_BY_BOUND = "otel_train_steps_by_bound_total"
METRIC_PHASE_MEMORY_PEAK = "otel_train_phase_memory_peak_bytes"
METRIC_HOST_RSS = "otel_train_host_rss_bytes"

# The job envelope and goodput (docs/telemetry.md, "The job envelope"): the job's time that
# is not steps, as spans of their own between steps.
STARTUP_SPAN_NAME = "train.startup"  # process start (or start_run) -> the first step's start
CHECKPOINT_SPAN_NAME = "train.checkpoint"  # run.checkpoint() / run.monitor("checkpoint")
CHECKPOINT_ACTION = "train.checkpoint.action"  # "save" | "load"
CHECKPOINT_OPERATION = "checkpoint"  # the operation (train.phase) a checkpoint span counts as
ATTEMPT = "train.attempt"  # 1, 2, ...: this process's attempt at the run (on train.startup)
RESTART_PREVIOUS_ATTEMPT = "train.restart.previous_attempt"  # the previous startup's trace id
RESTART_LOST_SECONDS = "train.restart.lost_seconds"  # what the restart cost (on train.startup)
STARTUP_FROM = "train.startup.from"  # "process" (its start time) | "start_run" (fallback)
KIND_ENVELOPE = "envelope"  # train.phase.kind of train.startup: neither training nor monitoring
METRIC_GOODPUT = "otel_train_goodput_ratio"
METRIC_JOB_SECONDS = "otel_train_job_seconds_total"  # label part: JOB_PARTS
JOB_PARTS = ("startup", "steps", "checkpoint", "evaluation", "restart_lost", "other")
# Communication per step (derived/comm_metrics.py)
METRIC_COLLECTIVE_SECONDS = "otel_train_collective_seconds_total"
METRIC_COLLECTIVE_BYTES = "otel_train_collective_bytes_total"
METRIC_COLLECTIVES = "otel_train_collectives_total"
METRIC_COLLECTIVE_EXPOSED_SECONDS = "otel_train_collective_exposed_seconds_total"
METRIC_OWN_WORK_SECONDS = "otel_train_own_work_seconds_total"

# At scale: summary mode (span_mode="summary", derived/step_summary.py). One root span per
# interval per exporting rank; per phase P (and for the whole step, "step"):
# train.summary.phase.<P>.{count, sum_seconds, min_seconds, max_seconds, p50_seconds, p99_seconds}
SUMMARY_SPAN_NAME = "train.summary"
SUMMARY_STEP_FIRST = "train.summary.step.first"  # the interval's first step number
SUMMARY_STEP_LAST = "train.summary.step.last"  # its last step number
SUMMARY_STEPS = "train.summary.steps"  # steps summarized (monitoring between steps apart)
SUMMARY_STEP_PREFIX = "train.summary.step."  # + count | sum_seconds | ... : the whole step
SUMMARY_PHASE_PREFIX = "train.summary.phase."  # + <phase>.count | .sum_seconds | ...
SUMMARY_SLOW_STEPS = "train.summary.slow_steps"  # step numbers marked slow (first 100)
SUMMARY_FAILED_STEPS = "train.summary.failed_steps"  # failed, stalled or truncated (first 100)
# On a kept root in export_ranks / summary mode: why a non-routine step was still exported.
SAMPLE_REASON_STALL = "stall"
SAMPLE_REASON_TRUNCATED = "truncated"

# Throughput, FLOPs and MFU (derived/throughput.py; recording/step_counts.py)
TOKENS = "train.tokens"  # on the root span: tokens this step trained on
SAMPLES = "train.samples"  # on the root span: samples (sequences, images) this step
FLOPS = "train.flops"  # on the root span: FLOPs of the step (counted once, or given)
FLOPS_COUNTED = "train.flops.counted"  # True on the one step run under FlopCounterMode
FLOPS_DTYPE = "train.flops.dtype"  # "bf16" | "fp16" | "tf32" | "fp32": the matmuls' dtype
PEAK_FLOPS = "train.peak_flops_per_second"  # the device's dense peak for that dtype
MFU = "train.mfu"  # on the root span: achieved FLOP/s over peak, whole step (0..1)
METRIC_TOKENS = "otel_train_tokens_total"
METRIC_SAMPLES = "otel_train_samples_total"
METRIC_TOKENS_RATE = "otel_train_tokens_per_second"
METRIC_SAMPLES_RATE = "otel_train_samples_per_second"
METRIC_FLOPS_PER_STEP = "otel_train_flops_per_step"
METRIC_ACHIEVED_FLOPS = "otel_train_achieved_flops_per_second"
METRIC_PEAK_FLOPS = "otel_train_peak_flops_per_second"
METRIC_MFU = "otel_train_mfu_ratio"
