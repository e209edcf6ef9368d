"""Which device a demo or example trains on: ``auto``, ``cpu`` or ``cuda``.

``auto`` is the accelerator when one is present (``torch.accelerator``, torch >= 2.6; else
CUDA when ``torch.cuda.is_available()``), otherwise the CPU. ``cuda`` asked for where none
is present is refused with a ``ValueError`` naming the option that asked for it, before
anything is built.

The run itself needs no device: ``device_sync="auto"`` (the default) times the accelerator
the process uses. This module only places the model and the batches.

Usage::

    from otel_train.common.training_device import DEVICE_CHOICES, training_device

    ap.add_argument("--device", choices=DEVICE_CHOICES, default="auto")
    device = training_device(args.device)        # torch.device("cuda") or ("cpu")
    model.to(device)

    # in an example's argparse main:
    add_device_argument(parser)
    device = device_from_arguments(parser, parser.parse_args(argv))
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEVICE_CHOICES", "accelerator_device", "add_device_argument",
           "device_from_arguments", "training_device"]

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def accelerator_device(torch: Any) -> Any | None:
    """The accelerator present in this process (a ``torch.device``), or None.

    ``torch.accelerator`` where torch has it (CUDA, XPU, MPS, ...), else CUDA through
    ``torch.cuda``. Asking does not initialize the device.
    """
    api = getattr(torch, "accelerator", None)
    if api is not None and hasattr(api, "is_available") and hasattr(api, "current_accelerator"):
        if api.is_available():
            return torch.device(api.current_accelerator())
        return None
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_available():
        return torch.device("cuda")
    return None


def training_device(choice: str = "auto", option: str = "--device", torch: Any = None) -> Any:
    """The ``torch.device`` for ``choice`` (one of :data:`DEVICE_CHOICES`).

    ``option`` names where the choice came from in errors (``--device``, an environment
    variable); ``torch`` is the module (tests pass a fake).
    """
    if torch is None:
        import torch
    if choice not in DEVICE_CHOICES:
        raise ValueError(f"{option} {choice!r}: must be one of {', '.join(DEVICE_CHOICES)}")
    if choice == "cpu":
        return torch.device("cpu")
    if choice == "cuda":
        cuda = getattr(torch, "cuda", None)
        if cuda is None or not cuda.is_available():
            raise ValueError(f"{option} cuda: no CUDA device is available here "
                             "(torch.cuda.is_available() is False); use "
                             f"{option} auto or {option} cpu")
        return torch.device("cuda")
    found = accelerator_device(torch)
    return found if found is not None else torch.device("cpu")


def add_device_argument(parser: Any) -> None:
    """``--device auto|cpu|cuda`` (default auto) on an ``argparse`` parser."""
    parser.add_argument("--device", choices=DEVICE_CHOICES, default="auto",
                        help="where the model, the batches and the monitoring run: auto (the "
                             "accelerator when present, else the CPU), cpu, or cuda "
                             "(default auto)")


def device_from_arguments(parser: Any, args: Any) -> Any:
    """``args.device`` as a ``torch.device``; a choice that can't be met ends the program
    through ``parser.error`` (exit status 2, the reason on stderr)."""
    try:
        return training_device(args.device, "--device")
    except ValueError as exc:
        parser.error(str(exc))
        raise  # parser.error exits; for a parser made not to
