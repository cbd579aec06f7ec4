"""Measure how exactly the AgentRun-like target keeps its own schedule, and how much load it takes.

    python -m csbench.localcloud.agentrun.accuracy [--rate 2000] [--duration 5]

Runs the target in a child process (its own interpreter and GIL, optionally pinned to a core) and drives
it from this one with aiohttp. Prints, from the server's ground-truth records:

* schedule error = actual send (after write) − planned deadline, for the first token and every token, at
  low load (sequential requests) and under an open-loop rate;
* delivery lag = client's perf_counter_ns at the event − server's after-write stamp (same host, same
  CLOCK_MONOTONIC), i.e. what a same-host measurement client adds;
* achieved vs offered rate and the server process's CPU share.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MS = 1_000_000


def _serve(port: int) -> None:
    from csbench.localcloud.cloud import LocalCloud

    async def main() -> None:
        cloud = LocalCloud(Path(tempfile.mkdtemp()), services=["agentrun"], ports={"agentrun": port})
        await cloud.start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    if os.environ.get("CSBENCH_TARGET_LOOP", "asyncio") == "uvloop":
        try:
            import uvloop

            uvloop.run(main())
            return
        except ImportError:
            pass
    asyncio.run(main())


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def _summary(name: str, xs: list[float]) -> str:
    return (f"{name:<34} n={len(xs):<6} p50={_pct(xs, .5):7.3f} p90={_pct(xs, .9):7.3f} "
            f"p99={_pct(xs, .99):7.3f} max={max(xs) if xs else float('nan'):7.3f} ms")  # fmt: skip


async def _one(session: Any, url: str, body: bytes, lags: list[float] | None) -> str:
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
        if lags is None:  # under load: just drain the stream, the server's stamps are what we measure
            await r.read()
            return r.headers["x-request-id"]
        stamps = []
        while line := await r.content.readline():
            if line.startswith(b"data: {") and b'"content":"' in line:
                stamps.append(time.perf_counter_ns())
        if lags is not None:
            lags.append(stamps)  # type: ignore[arg-type]
        return r.headers["x-request-id"]


async def _records(session: Any, base: str) -> list[dict[str, Any]]:
    out, since = [], 0
    while True:
        async with session.get(f"{base}/-/requests", params={"since": since, "limit": 20000}) as r:
            doc = await r.json()
        out += doc["records"]
        if not doc["records"]:
            return out
        since = doc["next"]


def _schedule_errors(recs: list[dict[str, Any]], gap_ns: int) -> tuple[list[float], list[float]]:
    first, every = [], []
    for r in recs:
        if r["outcome"] != "ok" or not r["token_ns"]:
            continue
        first.append((r["first_token_ns"] - r["planned_first_token_ns"]) / MS)
        every += [(t - (r["planned_first_token_ns"] + i * gap_ns)) / MS for i, t in enumerate(r["token_ns"])]
    return first, every


async def _run(base: str, rate: float, duration: float, pid: int) -> None:
    import aiohttp

    url = base + "/openai/v1/chat/completions"
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
    conn = aiohttp.TCPConnector(limit=512)
    async with aiohttp.ClientSession(connector=conn) as s:

        async def setup(cfg: dict[str, Any]) -> None:
            async with s.post(base + "/-/reset", json=cfg) as r:
                assert r.status == 200, await r.text()

        # 1. low load: sequential requests, TTFT 50 ms, 10 tokens 5 ms apart
        await setup({"ttft": 0.05, "inter_token": 0.005, "output_tokens": 10})
        lags: list[Any] = []
        ids = [await _one(s, url, body, lags) for _ in range(200)]
        recs = {r["request_id"]: r for r in await _records(s, base)}
        first, every = _schedule_errors(list(recs.values()), 5 * MS)
        deliver = [
            (c - t) / MS
            for rid, st in zip(ids, lags, strict=True)
            for c, t in zip(st, recs[rid]["token_ns"], strict=True)
        ]
        print("low load (sequential, ttft 50 ms, 10 tokens @ 5 ms):")
        print("  " + _summary("server first-token error", first))
        print("  " + _summary("server per-token error", every))
        print("  " + _summary("delivery lag (client - server)", deliver))

        # 2. open loop: short streams (16 tokens @ 1 ms, ttft 5 ms) at `rate` req/s, constant arrivals
        await setup({"ttft": 0.005, "inter_token": 0.001, "output_tokens": 16, "record_token_times": True})
        n = int(rate * duration)
        t_start = time.perf_counter() + 0.2
        cpu0 = _cpu(pid)
        late: list[float] = []

        async def one() -> None:
            try:
                await _one(s, url, body, None)
            except aiohttp.ClientError:
                pass

        tasks = []
        for i in range(n):  # pacer: constant arrivals, lateness recorded (the generator's own health)
            due = t_start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            late.append((time.perf_counter() - due) * 1000)
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t_start
        cpu = (_cpu(pid) - cpu0) / wall
        recs2 = await _records(s, base)
        ok = [r for r in recs2 if r["outcome"] == "ok"]
        first, every = _schedule_errors(ok, 1 * MS)
        print(f"open loop {rate:g} req/s for {duration:g} s (ttft 5 ms, 16 tokens @ 1 ms):")
        print(
            f"  completed ok {len(ok)}/{n}, achieved {len(ok) / wall:.0f} req/s, server CPU {cpu:.0%} of one core"
        )
        print("  " + _summary("client send lag (generator)", late))
        print("  " + _summary("server first-token error", first))
        print("  " + _summary("server per-token error", every))


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    p.add_argument("--rate", type=float, default=2000)
    p.add_argument("--duration", type=float, default=5)
    p.add_argument("--port", type=int, default=18917)
    p.add_argument("--server-cpu", type=int, default=1, help="core to pin the server to (-1: no pinning)")
    a = p.parse_args()
    if a.serve:
        _serve(a.serve)
        return
    cmd = [sys.executable, "-m", "csbench.localcloud.agentrun.accuracy", "--serve", str(a.port)]
    if a.server_cpu >= 0 and hasattr(os, "sched_setaffinity"):
        cmd = ["taskset", "-c", str(a.server_cpu), *cmd]
        os.sched_setaffinity(0, {c for c in os.sched_getaffinity(0) if c != a.server_cpu} or {0})
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", "target did not start"
        asyncio.run(_run(f"http://127.0.0.1:{a.port}", a.rate, a.duration, proc.pid))
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
