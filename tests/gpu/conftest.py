"""The CUDA tests: marked `cuda`, skipped ("no CUDA device") where torch sees no GPU, so the suite
passes on a CPU machine. `make gpu-check` runs them (scripts/gpu_check.py).

ATTNLAB_GPU_TESTS_DEVICE=cpu runs them on the CPU instead: a dry run of the tests themselves on a
machine without a GPU (every comparison of the two devices is then trivially equal).
"""

import os
from pathlib import Path

import pytest
import torch

from gpu.families import FAMILIES

DRY_RUN_DEVICE = os.environ.get("ATTNLAB_GPU_TESTS_DEVICE", "")


def pytest_collection_modifyitems(config, items):
    """Skip the `cuda` tests where there is no GPU: at collection, before any fixture trains."""
    if torch.cuda.is_available() or DRY_RUN_DEVICE:
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device(DRY_RUN_DEVICE or "cuda")


@pytest.fixture(autouse=True)
def exact_fp32():
    """fp32 products in fp32 during each test. The trainer turns TF32 on for the process (cuBLAS
    and cuDNN then round the inputs of fp32 products to 10 mantissa bits), and cuDNN's default
    has it on for convolutions: either would blur the comparisons of the two devices and of
    cached and uncached decoding. Restored afterwards."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def train_on(device: torch.device, family: str, folder: Path) -> Path:
    """`family` trained for 40 fp32 steps on `device` into folder/run (tiny: seconds on a GPU)."""
    from attnlab.train import train

    short = ("train.max_iters=40", "train.eval_interval=40", "train.eval_iters=2", "train.warmup_iters=2")
    config = FAMILIES[family].config(*short, f"train.device={device}", "train.dtype=float32")
    train(config, folder / "run", progress=False)
    return folder / "run"


@pytest.fixture(scope="session")
def trained(device, tmp_path_factory):
    """A family's name -> a run of it trained on the device (`train_on`), once per session; tests
    only read the run folders."""
    runs: dict[str, Path] = {}

    def run_of(family: str) -> Path:
        if family not in runs:
            runs[family] = train_on(device, family, tmp_path_factory.mktemp(family))
        return runs[family]

    return run_of
