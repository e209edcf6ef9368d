"""The peak table: the names torch reports for common accelerators find their dense peaks by
dtype; TF32 falls back to FP32 where there are no TF32 units; unknown devices have none."""

from __future__ import annotations

import pytest
import torch

from otel_train.common.device_peaks import dtype_name, peak_flops_per_second

T = 1e12


@pytest.mark.parametrize(("name", "dtype", "peak"), [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4 * T),  # the SXM part
    ("NVIDIA H100 PCIe", "bf16", 756.0 * T),
    ("NVIDIA H200", "tf32", 494.7 * T),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312.0 * T),
    ("NVIDIA A100-PCIE-40GB", "fp32", 19.5 * T),
    ("NVIDIA L4", "fp16", 121.0 * T),
    ("NVIDIA L40S", "bf16", 362.05 * T),  # not read as an L4
    ("NVIDIA A10G", "bf16", 125.0 * T),
    ("Tesla V100-SXM2-16GB", "fp16", 125.0 * T),
    ("Tesla V100-PCIE-32GB", "tf32", 14.0 * T),  # no TF32 units: the FP32 rate
    ("AMD Instinct MI300X", "bf16", 1307.4 * T),
])
def test_each_device_finds_its_dense_peak_for_the_dtype(name, dtype, peak):
    assert peak_flops_per_second(name, dtype) == pytest.approx(peak)


@pytest.mark.parametrize(("name", "dtype"), [
    ("Tesla V100-SXM2-16GB", "bf16"), ("NVIDIA GeForce RTX 4090", "bf16"), ("cpu", "fp32"),
    (None, "bf16"), ("NVIDIA H100 PCIe", "fp8"),
])
def test_a_device_or_dtype_not_in_the_table_has_no_peak(name, dtype):
    assert peak_flops_per_second(name, dtype) is None


def test_torch_dtypes_read_as_the_table_s_names():
    assert dtype_name(torch.bfloat16) == "bf16"
    assert dtype_name(torch.float16) == "fp16"
    assert dtype_name(torch.float32) == "fp32"
    assert dtype_name(torch.float32, allow_tf32=True) == "tf32"
    assert dtype_name(torch.int64) is None
