"""TorchTrainingInstrumentor: ``opentelemetry-instrument python train.py`` on an unmodified loop."""

from __future__ import annotations

import collections
import subprocess
from importlib.metadata import entry_points

import torch
from integration_support import (
    BIN,
    EXAMPLES,
    PYTHON,
    children,
    step_roots,
    subprocess_env,
)
from otlp_receivers import GrpcOtlpReceiver
from torch.utils.data import DataLoader

from otel_train.integrations.instrumentor import TorchTrainingInstrumentor

# What opentelemetry-instrument does when a distro is installed: configure the SDK from the
# OTEL_* variables (a global TracerProvider exporting over OTLP), then load instrumentors.
_DISTRO_LIKE = """
import runpy, sys
from opentelemetry.sdk._configuration import _OTelSDKConfigurator
_OTelSDKConfigurator().configure()
from otel_train.integrations.instrumentor import TorchTrainingInstrumentor
TorchTrainingInstrumentor().instrument()
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _check_zero_code_spans(spans: list) -> None:
    roots = step_roots(spans)
    assert sorted(roots) == [0, 1, 2, 3]
    for root in roots.values():
        assert [s.name for s in children(spans, root)] == [
            "data", "forward", "backward", "optimizer"]
    evals = [s for s in spans if s.name == "eval"]
    assert [s.attributes["train.step"] for s in evals] == [1, 3]
    assert all(s.attributes["train.phase.kind"] == "monitor" for s in evals)


def test_the_instrumentor_is_registered_as_an_opentelemetry_instrumentor() -> None:
    eps = {ep.name: ep.value for ep in entry_points(group="opentelemetry_instrumentor")}
    assert eps.get("otel_train") == (
        "otel_train.integrations.instrumentor:TorchTrainingInstrumentor")
    assert TorchTrainingInstrumentor().instrumentation_dependencies() == ("torch >= 2.1",)


def test_opentelemetry_instrument_traces_an_unmodified_script(tmp_path) -> None:
    with GrpcOtlpReceiver() as recv:
        # Four steps end before the exporter process is up: the exit waits for it, or
        # exports from here (test_export_process.py), within subprocess_env's 10 s.
        env = subprocess_env(recv, tmp_path)
        proc = subprocess.run(
            [str(BIN / "opentelemetry-instrument"), PYTHON, str(EXAMPLES / "zero_code.py"),
             "--steps", "4", "--eval-every", "2"],
            env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        try:
            spans = recv.wait_for_spans(lambda s: sum(x.name == "train.step" for x in s) >= 4,
                                        10)
        except TimeoutError as exc:  # with what the training process said about it
            raise AssertionError(f"{exc}\n{proc.stderr[-3000:]}") from exc
    _check_zero_code_spans(spans)


def test_under_an_application_tracer_provider_spans_go_through_its_pipeline(tmp_path) -> None:
    script = tmp_path / "distro_like.py"
    script.write_text(_DISTRO_LIKE)
    with GrpcOtlpReceiver() as recv:
        env = subprocess_env(recv, tmp_path, OTEL_TRACES_EXPORTER="otlp",
                             OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none",
                             OTEL_EXPORTER_OTLP_ENDPOINT=recv.endpoint,
                             OTEL_SERVICE_NAME="app-service")
        for key in ("OTEL_TRAIN_EXPORTER", "OTEL_TRAIN_OTLP_ENDPOINT",
                    "OTEL_TRAIN_OTLP_PROTOCOL"):
            env.pop(key)  # the application's provider decides where spans go
        proc = subprocess.run(
            [PYTHON, str(script), str(EXAMPLES / "zero_code.py"), "--steps", "4",
             "--eval-every", "2"], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        try:
            spans = recv.wait_for_spans(lambda s: sum(x.name == "train.step" for x in s) >= 4,
                                        10)
        except TimeoutError as exc:  # with what the training process said about it
            raise AssertionError(f"{exc}\n{proc.stderr[-3000:]}") from exc
    _check_zero_code_spans(spans)
    assert {s.resource_attributes["service.name"] for s in spans} == {"app-service"}
    assert collections.Counter(s.name for s in spans)["train.step"] == 4  # exported once


def test_uninstrument_removes_the_global_hooks_and_patches(tmp_path) -> None:
    import torch.nn.modules.module as module_mod
    import torch.optim.optimizer as optim_mod

    before = (len(module_mod._global_forward_pre_hooks),
              len(optim_mod._global_optimizer_pre_hooks),
              len(optim_mod._global_optimizer_post_hooks))
    original_iter = DataLoader.__iter__
    model = torch.nn.Linear(2, 1)
    inst = TorchTrainingInstrumentor()
    inst.instrument(run_options={"exporter": "none", "prometheus_port": None,
                                 "console": False, "status_dir": str(tmp_path)})
    try:
        model(torch.randn(1, 2)).sum().backward()  # adopts the model
        assert "train" in model.__dict__ and model._forward_hooks
    finally:
        inst.uninstrument()
    assert (len(module_mod._global_forward_pre_hooks),
            len(optim_mod._global_optimizer_pre_hooks),
            len(optim_mod._global_optimizer_post_hooks)) == before
    assert DataLoader.__iter__ is original_iter
    assert "train" not in model.__dict__ and not model._forward_hooks
