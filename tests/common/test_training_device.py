"""Where a demo or example trains: auto takes the accelerator when one is present (through
torch.accelerator, else torch.cuda), cpu always works, cuda without one is refused naming the
option."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from otel_train.common.training_device import DEVICE_CHOICES, training_device


def _torch(accelerator: str | None = None, cuda: bool = False,
           has_accelerator_api: bool = True) -> SimpleNamespace:
    """A torch module's device-finding surface: torch.accelerator (present or not) and
    torch.cuda, with the real torch.device."""
    api = SimpleNamespace(is_available=lambda: accelerator is not None,
                          current_accelerator=lambda: torch.device(accelerator))
    fake = SimpleNamespace(device=torch.device,
                           cuda=SimpleNamespace(is_available=lambda: cuda))
    if has_accelerator_api:
        fake.accelerator = api
    return fake


def test_auto_is_the_accelerator_torch_reports() -> None:
    assert training_device("auto", torch=_torch("cuda", cuda=True)) == torch.device("cuda")
    assert training_device("auto", torch=_torch("xpu")).type == "xpu"


def test_auto_falls_back_to_cuda_where_torch_has_no_accelerator_api() -> None:
    fake = _torch(cuda=True, has_accelerator_api=False)
    assert training_device("auto", torch=fake) == torch.device("cuda")


def test_auto_is_the_cpu_where_no_accelerator_is_present() -> None:
    assert training_device("auto", torch=_torch()) == torch.device("cpu")
    assert training_device("auto", torch=_torch(has_accelerator_api=False)).type == "cpu"


def test_auto_with_the_real_torch_on_a_machine_without_an_accelerator_is_the_cpu() -> None:
    if torch.accelerator.is_available():
        pytest.skip("an accelerator is present here")
    assert training_device() == torch.device("cpu")


def test_cpu_is_the_cpu_even_with_an_accelerator_present() -> None:
    assert training_device("cpu", torch=_torch("cuda", cuda=True)) == torch.device("cpu")


def test_cuda_is_cuda_where_it_is_available() -> None:
    assert training_device("cuda", torch=_torch("cuda", cuda=True)) == torch.device("cuda")


def test_cuda_without_a_cuda_device_is_refused_naming_the_option() -> None:
    with pytest.raises(ValueError, match=r"--device cuda: no CUDA device is available.*"
                                         r"--device auto or --device cpu"):
        training_device("cuda", torch=_torch())
    with pytest.raises(ValueError, match="OTEL_TRAIN_EXAMPLE_DEVICE cuda"):
        training_device("cuda", "OTEL_TRAIN_EXAMPLE_DEVICE", torch=_torch("xpu"))


def test_an_unknown_choice_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"--device 'gpu': must be one of auto, cpu, cuda"):
        training_device("gpu", torch=_torch())
    assert DEVICE_CHOICES == ("auto", "cpu", "cuda")
