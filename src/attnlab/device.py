"""Device and precision, resolved in one place. Modules follow `x.device`; only the trainer and the
CLI ask for a device."""

import contextlib

import torch

from attnlab.errors import UserError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str = "auto") -> torch.device:
    """ "auto" -> cuda when available, else cpu; "cpu", "cuda", "cuda:1" as given."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown device {name!r}; use auto, cpu or cuda") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {name!r} asked for, but no CUDA GPU is available; use --device cpu")
    return device


def autocast(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    """Mixed precision for the forward pass: bf16 or fp16 autocast keeps fp32 master weights."""
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[dtype])
