"""What every benchmark's JSON records about the run: the day, the machine and the software."""

import platform
from datetime import date

import torch

from attnlab.device import cpu_description


def run_info() -> dict[str, object]:
    """Date, processor, intra-op threads and torch version of this run."""
    return {
        "date": date.today().isoformat(),
        "machine": platform.processor() or platform.machine(),
        "cpu": cpu_description(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
