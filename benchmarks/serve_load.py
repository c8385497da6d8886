"""Load on `attnlab serve`: concurrent streaming clients against a live server on 127.0.0.1.

Two measurements:

- `sweep`: aggregate tokens/s and per-request latency (time to first token and to the whole
  completion, p50 and p99) for 1, 8, 32 and 64 concurrent streaming clients, each sending
  `--requests` completions one after another, against the server with continuous batching
  (`--max-batch 64`) and one request at a time (`--max-batch 1`), started anew for each mode.
- `load`: 100 concurrent streaming clients against the server's defaults (`--max-batch 32`,
  `--max-queue 64`): every error counted, 429s (the queue's bound) counted apart and retried
  after their Retry-After.

    python benchmarks/serve_load.py sweep RUN [--clients 1,8,32,64] [--requests 4] [--max-tokens 64] [--threads N]
    python benchmarks/serve_load.py load RUN [--clients 100] [--requests 3] [--threads N]

RUN is a character-level language-model run folder (a character is a token, so the streamed text
counts the tokens). Prints a Markdown table and one JSON line per configuration; `--json FILE`
saves them all.
"""

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

PROMPTS = ["ROMEO:\n", "First Citizen:\nBefore we proceed", "KING RICHARD III:\nNow is the winter", "Thou ", "\n"]


@dataclass
class Result:
    mode: str
    clients: int
    requests: int = 0
    tokens: int = 0
    seconds: float = 0.0
    errors: int = 0
    rejected: int = 0  # 429s: the queue's bound, retried
    first_token: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)
    error_examples: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        def pct(xs: list[float], q: float) -> float:
            if len(xs) < 2:
                return round(xs[0], 3) if xs else 0.0
            return round(statistics.quantiles(xs, n=100, method="inclusive")[q - 1], 3)

        return {
            "mode": self.mode,
            "clients": self.clients,
            "requests": self.requests,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 2),
            "tokens_per_s": round(self.tokens / self.seconds, 1) if self.seconds else 0.0,
            "first_token_p50_s": pct(self.first_token, 50),
            "first_token_p99_s": pct(self.first_token, 99),
            "latency_p50_s": pct(self.latency, 50),
            "latency_p99_s": pct(self.latency, 99),
            "errors": self.errors,
            "rejected_429": self.rejected,
            "error_examples": self.error_examples[:3],
        }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`attnlab serve RUN` in a child process, on a free loopback port."""

    def __init__(self, run: Path, *flags: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        cmd = [sys.executable, "-m", "attnlab", "serve", f"lm={run}", "--port", str(self.port), *flags]
        self.log = open(os.devnull, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited with status {self.proc.returncode}: {' '.join(cmd)}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise SystemExit("the server did not answer /healthz within 120 s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


async def one_completion(client: httpx.AsyncClient, url: str, body: dict, result: Result) -> None:
    """Send one streaming completion until it is served (429s retried); record its timings."""
    while True:
        start = time.perf_counter()
        first, tokens = None, 0
        try:
            async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
                if response.status_code == 429:
                    result.rejected += 1
                    await response.aread()
                    await asyncio.sleep(float(response.headers.get("retry-after", "1")))
                    continue
                if response.status_code != 200:
                    result.errors += 1
                    result.error_examples.append(f"{response.status_code}: {(await response.aread())[:200]!r}")
                    return
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    text = "".join(c.get("text", "") for c in json.loads(line[6:]).get("choices", []))
                    if text and first is None:
                        first = time.perf_counter() - start
                    tokens += len(text)
        except (httpx.HTTPError, json.JSONDecodeError) as e:
            result.errors += 1
            result.error_examples.append(f"{type(e).__name__}: {e}")
            return
        result.requests += 1
        result.tokens += tokens
        result.latency.append(time.perf_counter() - start)
        result.first_token.append(first if first is not None else result.latency[-1])
        return


async def drive(url: str, mode: str, clients: int, requests: int, max_tokens: int) -> Result:
    """`clients` concurrent clients, each sending `requests` completions one after another."""
    result = Result(mode, clients)
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:

        async def client_loop(i: int) -> None:
            for r in range(requests):
                body = {
                    "model": "lm",
                    "prompt": PROMPTS[(i + r) % len(PROMPTS)],
                    "max_tokens": max_tokens,
                    "temperature": 0.8,
                    "seed": 1000 * i + r,
                    "stream": True,
                }
                await one_completion(client, url, body, result)

        start = time.perf_counter()
        await asyncio.gather(*(client_loop(i) for i in range(clients)))
        result.seconds = time.perf_counter() - start
    return result


def markdown(rows: list[dict]) -> str:
    head = (
        "| mode | clients | requests | tokens/s | first token p50 / p99 (s) | completion p50 / p99 (s) "
        "| errors | 429s |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['clients']} | {r['requests']} | {r['tokens_per_s']:.0f} | "
            f"{r['first_token_p50_s']:.2f} / {r['first_token_p99_s']:.2f} | "
            f"{r['latency_p50_s']:.2f} / {r['latency_p99_s']:.2f} | {r['errors']} | {r['rejected_429']} |"
        )
    return "\n".join(lines)


def threads_flag(args: argparse.Namespace) -> list[str]:
    """The server's torch threads when given (else its default: the cores less one)."""
    return ["--threads", str(args.threads)] if args.threads else []


def sweep(args: argparse.Namespace) -> list[dict]:
    rows = []
    modes = {"batched": ["--max-batch", "64"], "one at a time": ["--max-batch", "1"]}
    for mode, flags in modes.items():
        server = Server(args.run, *flags, "--max-queue", "256", *threads_flag(args))
        try:
            for clients in args.clients:
                row = asyncio.run(drive(server.url, mode, clients, args.requests, args.max_tokens)).summary()
                print(json.dumps(row), flush=True)
                rows.append(row)
        finally:
            server.stop()
    by = {(r["mode"], r["clients"]): r["tokens_per_s"] for r in rows}
    for clients in args.clients:
        if by.get(("one at a time", clients)):
            ratio = by[("batched", clients)] / by[("one at a time", clients)]
            print(f"{clients} clients: batched / one at a time = {ratio:.2f}x tokens/s", flush=True)
    return rows


def load(args: argparse.Namespace) -> list[dict]:
    server = Server(args.run, "--max-batch", "32", "--max-queue", "64", *threads_flag(args))
    try:
        row = asyncio.run(drive(server.url, "load", args.clients[0], args.requests, args.max_tokens)).summary()
        alive = httpx.get(f"{server.url}/healthz", timeout=5).status_code == 200
    finally:
        server.stop()
    row["server_alive_after"] = alive
    print(json.dumps(row), flush=True)
    return [row]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["sweep", "load"])
    parser.add_argument("run", type=Path, help="a character-level language-model run folder")
    parser.add_argument("--clients", default=None, help="comma-separated client counts (sweep: 1,8,32,64; load: 100)")
    parser.add_argument("--requests", type=int, default=None, help="completions per client (sweep 4, load 3)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, help="the server's torch threads (default: the server's own)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    default_clients, default_requests = ("1,8,32,64", 4) if args.what == "sweep" else ("100", 3)
    args.clients = [int(c) for c in (args.clients or default_clients).split(",")]
    args.requests = args.requests or default_requests
    rows = sweep(args) if args.what == "sweep" else load(args)
    print(markdown(rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
