"""The time between the chunks of streamed completions of `attnlab serve`: `--clients` streams at
once (4 by default) against a live server on 127.0.0.1, each asking for `--max-tokens` tokens;
each server-sent event's arrival is timed on the client.

    python benchmarks/stream_gaps.py RUN [--clients 4] [--max-tokens 64] [--rounds 3] [--threads N] [--no-fused]

RUN is a character-level language-model run folder (a token is a character, so a chunk of one
character is one token). Prints, per round and over all: chunks per stream, characters per
chunk, and the gaps between a stream's consecutive chunks (median, p90, max) in milliseconds.
`PYTHONPATH=OTHER/src` measures another checkout's server (the server runs as a subprocess).
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from serve_load import free_port  # noqa: E402


async def one_stream(http: httpx.AsyncClient, seed: int, max_tokens: int) -> list[tuple[float, str]]:
    """(arrival time, text) of each chunk of one streamed completion."""
    body = {"model": "m", "prompt": "ROMEO:\n", "max_tokens": max_tokens, "temperature": 0.8, "seed": seed}
    chunks = []
    async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                text = json.loads(line[6:])["choices"][0]["text"]
                if text:
                    chunks.append((time.perf_counter(), text))
    return chunks


async def round_of(url: str, clients: int, max_tokens: int, seed: int) -> list[list[tuple[float, str]]]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        return await asyncio.gather(*(one_stream(http, seed + i, max_tokens) for i in range(clients)))


def summary(streams: list[list[tuple[float, str]]]) -> dict:
    gaps = [(b[0] - a[0]) * 1000 for s in streams for a, b in zip(s, s[1:], strict=False)]
    sizes = [len(text) for s in streams for _, text in s]
    q = statistics.quantiles(gaps, n=10, method="inclusive") if len(gaps) > 1 else [0.0] * 9
    return {
        "chunks_per_stream": round(statistics.mean(len(s) for s in streams), 1),
        "chars_per_chunk": round(statistics.mean(sizes), 2),
        "gap_ms_p50": round(statistics.median(gaps), 2),
        "gap_ms_p90": round(q[8], 2),
        "gap_ms_max": round(max(gaps), 2),
    }


def serve(run: Path, port: int, threads: int | None, fused: bool) -> subprocess.Popen:
    command = [sys.executable, "-m", "attnlab", "serve", f"m={run}", "--port", str(port), "--max-tokens", "100000"]
    command += ["--threads", str(threads)] if threads else []
    command += [] if fused else ["--no-fused"]
    server = subprocess.Popen(command, env=os.environ.copy(), stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                return server
        except httpx.TransportError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit("the server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a character-level language-model run folder")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, help="the server's torch threads")
    parser.add_argument("--no-fused", action="store_true", help="the server's PyTorch decoding step")
    args = parser.parse_args()
    port = free_port()
    server = serve(args.run, port, args.threads, not args.no_fused)
    try:
        url = f"http://127.0.0.1:{port}"
        asyncio.run(round_of(url, 1, 4, 0))  # warm up
        everything = []
        for r in range(args.rounds):
            streams = asyncio.run(round_of(url, args.clients, args.max_tokens, 100 * r))
            everything += streams
            print(json.dumps({"round": r, "clients": args.clients, **summary(streams)}))
        print(json.dumps({"round": "all", "clients": args.clients, **summary(everything)}))
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
