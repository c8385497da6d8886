"""WaveNet generation, one sequence on one thread: naive against cached against fused.

- naive: rerun the network over the last receptive field for every sample (`cached=False`);
- cached: each layer's queue of past inputs, `WaveNet.step` in Python (`fused=False`);
- fused: the same step as one C++ call (`attnlab.accel.wavenet`; `fused=True`).

All three through `attnlab.decode.audio.generate_audio` with the same sampling picker and seed, at
the preset's widths (32 residual, 32 dilation, 64 skip channels; random weights, which cost what
trained ones do) for two receptive fields: the lecture's block (dilations 1, 2, ..., 512: 1,024
samples) and the `fsdd-wavenet` preset's (1..128 twice: 511). Rates are steady-state samples/s:
the picker stamps the time of every sample, and a rate counts the samples after the first
receptive field (the naive window full, every ring wrapped). The methods alternate within each
repeat, and the ratios are taken within a repeat (the machine is shared). Beside the wall-clock
rates, samples per second of this process's CPU time: what one core does when it is not shared. The first receptive
field and more of the naive samples must equal the fused ones, sample for sample.

    OMP_NUM_THREADS=1 python benchmarks/wavenet_generation.py [--samples 4000] [--naive-samples 300]
        [--repeats 3] [--out benchmarks/results/wavenet-generation.json]
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from run_info import run_info  # noqa: E402

from attnlab.accel import wavenet  # noqa: E402
from attnlab.decode.audio import generate_audio  # noqa: E402
from attnlab.decode.sampling import sampling_picker  # noqa: E402
from attnlab.models.wavenet import WaveNet, WaveNetConfig  # noqa: E402

FIELDS = {1024: dict(layers_per_block=10, n_blocks=1), 511: dict(layers_per_block=8, n_blocks=2)}
METHODS = {"naive": dict(cached=False), "cached": dict(fused=False), "fused": dict(fused=True)}


def timed(model: WaveNet, method: str, n: int, seed: int) -> tuple[float, float, torch.Tensor]:
    """(steady-state samples/s after the first receptive field, the same per second of CPU time,
    the samples `(1, n)`)."""
    sampler = sampling_picker(1.0, generator=torch.Generator().manual_seed(seed))
    stamps: list[tuple[float, float]] = []

    def pick(logits: torch.Tensor) -> torch.Tensor:
        stamps.append((time.perf_counter(), time.process_time()))
        return sampler(logits)

    out = generate_audio(model, torch.tensor([7]), None, n, pick, **METHODS[method])
    rf = model.config.receptive_field
    wall, cpu = (
        (len(stamps) - rf) / (stamps[-1][0] - stamps[rf - 1][0]),
        (len(stamps) - rf) / (stamps[-1][1] - stamps[rf - 1][1]),
    )
    return wall, cpu, out


def measure(rf: int, args: argparse.Namespace) -> dict[str, object]:
    """Each method's rates over the repeats, the ratios within each, and the samples' agreement."""
    torch.manual_seed(0)
    model = WaveNet(WaveNetConfig(**FIELDS[rf])).eval()
    assert model.config.receptive_field == rf
    rates: dict[str, list[float]] = {m: [] for m in METHODS}
    cpu_rates: dict[str, list[float]] = {m: [] for m in METHODS}
    identical = True
    for _ in range(args.repeats):
        samples = {}
        for method in METHODS:
            n = rf + (args.naive_samples if method == "naive" else args.samples)
            rate, cpu_rate, samples[method] = timed(model, method, n, seed=1)
            rates[method].append(rate)
            cpu_rates[method].append(cpu_rate)
        k = samples["naive"].size(1)
        identical &= all(torch.equal(samples[m][:, :k], samples["naive"]) for m in ("cached", "fused"))
    ratios = {
        f"{a}/{b}": [x / y for x, y in zip(rates[a], rates[b], strict=True)]
        for a, b in (("fused", "naive"), ("cached", "naive"), ("fused", "cached"))
    }
    return {
        "receptive_field": rf,
        "layers": len(model.config.dilations),
        "samples_per_s": {m: statistics.median(r) for m, r in rates.items()},
        "samples_per_s_all": rates,
        "samples_per_cpu_s": {m: statistics.median(r) for m, r in cpu_rates.items()},
        "samples_per_cpu_s_all": cpu_rates,
        "ratios_median": {k: statistics.median(v) for k, v in ratios.items()},
        "ratios_all": ratios,
        "naive_samples_compared": rf + args.naive_samples,
        "identical_to_naive": identical,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=4000, help="cached and fused: samples past the first field")
    parser.add_argument("--naive-samples", type=int, default=300, help="naive: samples past the first field")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/wavenet-generation.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    built = wavenet.is_built()
    start = time.perf_counter()
    if wavenet.extension() is None:
        raise SystemExit("the fused WaveNet step could not be built here")
    load_s = time.perf_counter() - start  # paid once a process; the build once a machine
    result = {
        **run_info(),
        "extension": {"was_built": built, ("load_s" if built else "build_s"): round(load_s, 2)},
        "fields": [measure(rf, args) for rf in FIELDS],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for f in result["fields"]:
        rates = ", ".join(f"{m} {v:,.0f}" for m, v in f["samples_per_s"].items())
        ratios = ", ".join(f"{k} {v:.1f}x" for k, v in f["ratios_median"].items())
        cpu = ", ".join(f"{m} {v:,.0f}" for m, v in f["samples_per_cpu_s"].items())
        print(f"rf {f['receptive_field']}: samples/s {rates}; {ratios}; identical {f['identical_to_naive']}")
        print(f"  samples per CPU second: {cpu}")


if __name__ == "__main__":
    main()
