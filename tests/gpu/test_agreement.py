"""The GPU computes what the CPU computes: each family's logits for one training batch, the same
weights on both devices, in fp32.

The tolerance, derived. Both devices evaluate the same fp32 function in different orders (cuBLAS,
cuDNN and MKL/oneDNN block their sums differently; CUDA's index_add adds with atomics in any
order). A sum of K products in fp32 is off by about √K·u of its terms' scale, u = 2⁻²⁴ ≈ 6e-8:
with K at most a few hundred here (d_ff = 64, 7 × 7 kernels, the 478 bag-of-words features of the
Cora slice), about 1e-6 per layer, and a few layers, normalisations and softmaxes carry that to
~1e-5 of the logits' scale. The bound is 1e-4 × max|logits| (elementwise, on the max-abs scale of
the CPU's logits): ten times that estimate, and far below what a wrong path gives: TF32 products
(u = 2⁻¹¹ ≈ 5e-4) or bf16 ones (u = 2⁻⁸ ≈ 4e-3) land at 1e-3 to 1e-2 of the scale, and a device-
dependent mistake (a mask, a position, dropout left on) at its whole size. TF32 is off during
these tests (conftest.exact_fp32).
"""

import copy

import pytest
import torch

from gpu.families import FAMILIES, LOGITS

pytestmark = pytest.mark.cuda

RELATIVE_TOLERANCE = 1e-4


@pytest.mark.parametrize("name", list(FAMILIES))
def test_logits_on_the_device_are_the_cpus(name, device, tmp_path):
    family = FAMILIES[name]
    config = family.config("train.device=cpu")
    task = family.task(config, tmp_path)
    torch.manual_seed(0)
    model = task.build_model().float().eval()
    batch = task.train_batch(0, torch.Generator().manual_seed(0))
    logits = LOGITS[config.task]
    with torch.no_grad():
        on_cpu = logits(task, model, batch, torch.device("cpu"))
        on_device = logits(task, copy.deepcopy(model).to(device), batch, device)
    assert on_device.device.type == device.type and on_device.dtype == torch.float32
    on_device = on_device.cpu()
    assert on_device.shape == on_cpu.shape
    scale = on_cpu.abs().max().item()
    error = (on_device - on_cpu).abs().max().item()
    assert scale > 0 and error <= RELATIVE_TOLERANCE * scale, f"max |cuda - cpu| = {error:.3g}, scale {scale:.3g}"
