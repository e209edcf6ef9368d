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

KIND_TRAIN = "train"
KIND_MONITOR = "monitor"

INSTRUMENTATION_SCOPE = "otel_train"

# Prometheus metric names (prefix otel_train_, base units, ratios 0..1)
METRIC_STEP_DURATION = "otel_train_step_duration_seconds"
METRIC_PHASE_DURATION = "otel_train_phase_duration_seconds"
METRIC_MONITORING_OVERHEAD = "otel_train_monitoring_overhead_ratio"
METRIC_OPERATION_OVERHEAD = "otel_train_operation_overhead_ratio"
METRIC_BUDGET = "otel_train_monitoring_budget_ratio"
METRIC_STEPS = "otel_train_steps_total"
METRIC_SLOW_STEPS = "otel_train_slow_steps_total"
METRIC_LAST_STEP_TIMESTAMP = "otel_train_last_step_timestamp_seconds"
METRIC_STEP_IN_PROGRESS = "otel_train_step_in_progress_seconds"
METRIC_SPANS_DROPPED = "otel_train_spans_dropped_total"
METRIC_INSTRUMENTATION_OVERHEAD = "otel_train_instrumentation_overhead_ratio"
METRIC_GPU_UTILIZATION = "otel_train_gpu_utilization_ratio"
METRIC_GPU_MEMORY_USED = "otel_train_gpu_memory_used_bytes"

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
