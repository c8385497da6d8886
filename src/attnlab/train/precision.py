"""Mixed precision for training: autocast in the forward pass, fp32 master weights, and for fp16 a
gradient scaler.

bfloat16 has float32's exponent range, so its gradients need no scaling. float16 has five exponent
bits: small gradients underflow to zero unless the loss is multiplied by a large factor before the
backward pass and the gradients divided by it before the optimizer step (Micikevicius et al. 2018,
"Mixed Precision Training", section 3.2). `torch.amp.GradScaler` does that and adapts the factor:
a step whose gradients overflow is skipped and the factor halved.
"""

import contextlib
from typing import Any

import torch

from attnlab.device import autocast
from attnlab.errors import ConfigError


class Precision:
    """The training step's precision policy for one device and `train.dtype`.

    With "float32" or "bfloat16" the scaler is disabled and every method is the plain operation
    (`backward` is `loss.backward()`, `step` is `optimizer.step()`).
    """

    def __init__(self, device: torch.device, dtype: str) -> None:
        check_dtype(device, dtype)
        self.device, self.dtype = device, dtype
        self.scaler = torch.amp.GradScaler(device.type, enabled=dtype == "float16")

    @property
    def scaling(self) -> bool:
        """Whether a gradient scaler runs (fp16), which skips overflowing steps by itself."""
        return self.scaler.is_enabled()

    def autocast(self) -> contextlib.AbstractContextManager:
        """The forward pass's autocast context (a no-op for float32)."""
        return autocast(self.device, self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward pass of a scalar loss, scaled first when fp16 needs it."""
        self.scaler.scale(loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients by the scale in place, so that clipping sees their true norm."""
        self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer step (skipped by the scaler when fp16 gradients overflowed), then the
        scale's update."""
        self.scaler.step(optimizer)
        self.scaler.update()

    def state_dict(self) -> dict[str, Any]:
        """The scaler's state (scale, growth tracker) for train_state.pt; empty when disabled."""
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.scaler.load_state_dict(state)


def check_dtype(device: torch.device, dtype: str) -> None:
    """fp16 training is for GPUs: its gradient scaler and fast kernels are CUDA's."""
    if dtype == "float16" and device.type != "cuda":
        raise ConfigError(
            f"train.dtype = 'float16' needs a CUDA GPU (this run is on {device.type}); "
            "on CPU use train.dtype = 'bfloat16' (or 'float32')"
        )
