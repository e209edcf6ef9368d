"""Peak dense FLOP/s of common accelerators, by dtype: the denominator of MFU.

Figures are the vendors' datasheet peaks *without* structured sparsity (the datasheets print
the sparse figure first for tensor cores: the dense one is half of it). A device is matched
by the name ``torch.cuda.get_device_name`` reports, lower-cased (e.g. "NVIDIA H100 80GB
HBM3" is the SXM part, "NVIDIA H100 PCIe" the PCIe one). Anything not in the table (a CPU,
a TPU, an unknown card) has no peak: MFU is then left out unless the run is given one with
``peak_flops_per_second``.

Sources (dense, per GPU):
- H100 SXM / PCIe, H200: NVIDIA H100 Tensor Core GPU datasheet and H200 product brief.
- A100 40 GB / 80 GB: NVIDIA A100 Tensor Core GPU datasheet (same compute both sizes).
- L4: NVIDIA L4 datasheet. L40S: NVIDIA L40S datasheet. A10G: NVIDIA A10 datasheet (the
  A10G is its cloud variant, same tensor-core rates). V100: NVIDIA V100 datasheet (SXM2 /
  PCIe; no bf16 or tf32 units: bf16 is left out, tf32 falls back to fp32).
- MI300X: AMD Instinct MI300X datasheet (matrix cores, dense).

Usage::

    peak_flops_per_second("NVIDIA H100 80GB HBM3", "bf16")   # 989.4e12
    dtype_name(torch.bfloat16)                               # "bf16"
"""

from __future__ import annotations

from typing import Any

T = 1e12
# (substrings that must all appear in the lower-cased name, peaks by dtype). First match
# wins: the more specific names come first ("h100 pcie" before "h100", "l40s" before "l4").
DEVICE_PEAKS: tuple[tuple[tuple[str, ...], dict[str, float]], ...] = (
    (("h200",), {"bf16": 989.4 * T, "fp16": 989.4 * T, "tf32": 494.7 * T, "fp32": 66.9 * T}),
    (("h100", "pcie"), {"bf16": 756.0 * T, "fp16": 756.0 * T, "tf32": 378.0 * T,
                        "fp32": 51.2 * T}),
    (("h100",), {"bf16": 989.4 * T, "fp16": 989.4 * T, "tf32": 494.7 * T, "fp32": 66.9 * T}),
    (("a100",), {"bf16": 312.0 * T, "fp16": 312.0 * T, "tf32": 156.0 * T, "fp32": 19.5 * T}),
    (("l40s",), {"bf16": 362.05 * T, "fp16": 362.05 * T, "tf32": 183.0 * T,
                 "fp32": 91.6 * T}),
    (("l4",), {"bf16": 121.0 * T, "fp16": 121.0 * T, "tf32": 60.0 * T, "fp32": 30.3 * T}),
    (("a10g",), {"bf16": 125.0 * T, "fp16": 125.0 * T, "tf32": 62.5 * T, "fp32": 31.2 * T}),
    (("v100", "pcie"), {"fp16": 112.0 * T, "fp32": 14.0 * T}),
    (("v100",), {"fp16": 125.0 * T, "fp32": 15.7 * T}),
    (("mi300x",), {"bf16": 1307.4 * T, "fp16": 1307.4 * T, "tf32": 653.7 * T,
                   "fp32": 163.4 * T}),
)

def peak_flops_per_second(device_name: str | None, dtype: str) -> float | None:
    """The table's dense peak for ``device_name`` at ``dtype``; None when not known."""
    if not device_name:
        return None
    name = device_name.lower()
    for needles, peaks in DEVICE_PEAKS:
        if all(n in name for n in needles):
            if dtype == "tf32" and "tf32" not in peaks:
                return peaks.get("fp32")  # no tf32 units: fp32 matmuls run at the fp32 rate
            return peaks.get(dtype)
    return None


def dtype_name(dtype: Any, allow_tf32: bool = False) -> str | None:
    """The table's name for a torch dtype ("bf16", ...); fp32 is "tf32" where TF32 is on."""
    text = str(dtype).rsplit(".", 1)[-1]
    if text == "bfloat16":
        return "bf16"
    if text in ("float16", "half"):
        return "fp16"
    if text in ("float32", "float"):
        return "tf32" if allow_tf32 else "fp32"
    return None
