"""Figures that prove the probe's measurement engine (issue 4 §4), against fastsse on the other core.

fastsse (localcloud/agentrun/fastsse.py) runs in a child process pinned to SERVER_CPU; the engine
(`probe.engine.run.run_load`, aiohttp + uvloop) runs in this process with its thread pinned to GEN_CPU, so
the two never compete for a core and the generator's CPU share is its own. Every fastsse event carries the
server's CLOCK_MONOTONIC just before the write and `/-/requests` returns per-request ground truth, matched to
the probe's records by `x-request-id`.

- measurement_rate: wrk (C, raw peer) on the non-streaming path, then open-loop rate steps of short SSE
  streams until the self-check says `invalid`: the last `valid` rate, the first `invalid` one, their ratio to wrk;
- measurement_error: TTFT / end-to-end observation error (probe stamp − server write stamp) p50/p99 at
  ~10 %, ~50 %, ~80 % generator CPU, with the achieved CPU share printed next to each;
- measurement_stall: a 1 s server stall under open loop (TTFT from intended) and closed loop (from send).

Every run is bounded (fixed schedule, timeouts) and uses 127.0.0.1 only. See docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from benches import Figure, bench, percentile
from csbench.localcloud.agentrun.fastsse import CHAT_PATH, FastSSEConfig, FastSSEProcess

GEN_CPU, SERVER_CPU = 0, 1
CHAT = CHAT_PATH.decode()
MS = 1e-6
BODY = '{"model":"m","messages":[{"role":"user","content":"hi"}]}'
RATE_STEPS = (100, 250, 500, 1000, 1500, 2000, 2500, 3000, 4000)
STEP_WARMUP_S, STEP_S = 1.0, 5.0


# -- plumbing -----------------------------------------------------------------------------------------------

@contextmanager
def _pinned(cpu: int) -> Iterator[None]:
    """Pin the calling thread (the engine's event loop) to `cpu`; restore afterwards. Linux applies
    sched_setaffinity(0) to the calling thread; threads it starts (aiohttp's resolver) inherit it."""
    if not hasattr(os, "sched_setaffinity") or cpu not in os.sched_getaffinity(0):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _server_cpu() -> int | None:
    return SERVER_CPU if hasattr(os, "sched_getaffinity") and SERVER_CPU in os.sched_getaffinity(0) else None


def _http(url: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=30) as r:
        return json.loads(r.read())


def _run(url: str, load: Any, *, path: str = CHAT) -> Any:
    """One engine run on the generator core, under uvloop like the carrier. Returns the RunResult."""
    import uvloop

    from csbench.probe.engine.client import Timeouts
    from csbench.probe.engine.requests import OpenAIBody
    from csbench.probe.engine.run import run_load
    from csbench.probe.protocol import Limits, Target

    target = Target(url=url, path=path, model="fastsse")
    # Generous limits: the bench, not the carrier's safety caps, decides the load; in-flight must not be
    # capped or a stall would be hidden by client-side queueing.
    limits = Limits(max_concurrency=4000, max_rate_per_s=20_000, max_requests=1_000_000)
    busy0, own0, t0 = _core_busy(GEN_CPU), time.process_time(), time.monotonic()
    with _pinned(GEN_CPU):
        res = uvloop.run(run_load(target, load, limits=limits, openai_body=OpenAIBody(max_tokens=8),
                                  timeouts=Timeouts(connect_s=5, ttft_s=10, idle_s=10, total_s=15)))
    wall = time.monotonic() - t0
    # The cores are shared with whatever else runs on the host: CPU of the generator core that was not ours
    # (other processes, interrupts) is the first thing to look at when a verdict is worse than expected.
    res.extra["foreign_cpu_gen_core"] = max(0.0, (_core_busy(GEN_CPU) - busy0 - (time.process_time() - own0)) / wall)
    return res


def _core_busy(cpu: int) -> float:
    """Busy seconds of one core since boot (/proc/stat: all but idle and iowait); 0 where unavailable."""
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith(f"cpu{cpu} "):
                    v = [int(x) for x in line.split()[1:]]
                    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")
    except OSError:
        pass
    return 0.0


def _ground_truth(url: str, since: int) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    while True:
        page = _http(f"{url}/-/requests?since={since}&limit=20000")
        for r in page["records"]:
            out[r["request_id"]] = r
        if not page["records"]:
            return out
        since = page["next"]


def _last_seq(url: str) -> int:
    return int(_http(f"{url}/-/requests?since=1000000000")["last_seq"])


def _cpu_share(summary: dict[str, Any]) -> float:
    return float(summary["selfcheck"]["cpu_share"] or 0.0)


def _host_speed() -> Figure:
    """A machine-speed yardstick printed next to the rates: per-core figures only compare across hosts
    together with it (the reference lab of load_anchors.md is not this VM)."""
    import timeit

    best = min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000
    return Figure("measurement_host_sum_range_1000", best * 1e6, "us", "pure-Python speed of the generator's host")


# -- wrk, the raw peer --------------------------------------------------------------------------------------

WRK_LUA = f"""wrk.method = "POST"
wrk.body = '{BODY}'
wrk.headers["Content-Type"] = "application/json"
"""


def wrk_requests_per_s(url: str, duration_s: int = 5) -> float:
    """`wrk -t1 -c64` POSTing the non-streaming body, pinned to the generator core."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise RuntimeError("wrk is not installed: apt-get install -y wrk (listed in .ci/apt-packages)")
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as lua:
        lua.write(WRK_LUA)
        lua.flush()
        cmd = [wrk, "-t1", "-c64", f"-d{duration_s}s", "-s", lua.name, url + CHAT]
        pre = (lambda: os.sched_setaffinity(0, {GEN_CPU})) if _server_cpu() is not None else None
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + 30, preexec_fn=pre)
    m = re.search(r"Requests/sec:\s+([\d.]+)", out.stdout)
    if out.returncode != 0 or m is None:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stdout[-300:]} {out.stderr[-300:]}")
    if "Non-2xx" in out.stdout or "Socket errors" in out.stdout:
        raise RuntimeError(f"wrk saw errors, the figure would be wrong: {out.stdout[-400:]}")
    return float(m.group(1))


# -- benches ------------------------------------------------------------------------------------------------

@bench("measurement_rate")
def measurement_rate() -> list[Figure]:
    """Highest open-loop rate of short SSE streams (8 chunks + usage + [DONE] in one write) with a `valid`
    self-check, and where it turns `invalid`; wrk's requests/s on the same server in the same run."""
    from csbench.probe.engine.load import LoadSpec

    figures = [_host_speed()]
    with FastSSEProcess(FastSSEConfig(events=8), cpu=_server_cpu()) as srv:
        wrk_rps = wrk_requests_per_s(srv.url)
        figures.append(Figure("measurement_wrk_nonstream_rps", wrk_rps, "req/s",
                              "wrk -t1 -c64 -d5s, POST non-streaming, fastsse 1 process; peer, closed loop"))
        last_valid = first_invalid = foreign = 0.0
        verdicts = []
        for k, rate in enumerate(RATE_STEPS):
            cpu0, t0 = srv.cpu_seconds(), time.monotonic()
            res = _run(srv.url, LoadSpec(model="poisson", rate=rate, warmup_s=STEP_WARMUP_S,
                                         duration_s=STEP_S, seed=k))
            server_share = (srv.cpu_seconds() - cpu0) / (time.monotonic() - t0)
            s = res.summary()
            verdict = s["selfcheck"]["verdict"]
            foreign = max(foreign, s["foreign_cpu_gen_core"])
            verdicts.append(f"{rate}/s {verdict} cpu={_cpu_share(s):.2f} srv={server_share:.2f} "
                            f"foreign={s['foreign_cpu_gen_core']:.2f} "
                            f"{'; '.join(s['selfcheck']['reasons'])}".strip())
            if verdict == "valid":
                last_valid = rate
                figures.append(Figure("measurement_max_valid_sse_rate_gen_cpu", _cpu_share(s), "share",
                                      f"generator CPU at {rate}/s"))
            if verdict == "invalid":
                first_invalid = rate
                figures.append(Figure("measurement_first_invalid_gen_cpu", _cpu_share(s), "share",
                                      "; ".join(s["selfcheck"]["reasons"])[:300]))
                break
        # keep only the figure of the last valid step (appended once per valid step above)
        cpu_figs = [f for f in figures if f.name == "measurement_max_valid_sse_rate_gen_cpu"]
        figures = [f for f in figures if f.name != "measurement_max_valid_sse_rate_gen_cpu"] + cpu_figs[-1:]
    note = " | ".join(verdicts)
    figures += [
        Figure("measurement_max_valid_sse_rate", last_valid, "req/s/core",
               f"open loop Poisson, {STEP_S:g} s steady windows; steps: {note}"[:1000]),
        Figure("measurement_first_invalid_sse_rate", first_invalid, "req/s/core",
               "0 = never invalid up to the last step"),
        Figure("measurement_rate_foreign_cpu_gen_core_max", foreign, "share",
               "most CPU other processes took from the generator core in any step"),
        Figure("measurement_max_valid_to_wrk_ratio", last_valid / wrk_rps if wrk_rps else 0.0, "ratio",
               "probe's valid open-loop SSE rate / wrk's closed-loop non-streaming rate"),
    ]
    return figures


@bench("measurement_error")
def measurement_error() -> list[Figure]:
    """Observation error of TTFT and end-to-end against fastsse's write stamps, at three generator loads."""
    from csbench.probe.engine.load import LoadSpec

    # A realistic short stream: first event 5 ms after the headers, 8 events 1 ms apart (9 writes).
    path = CHAT + "?ttft_ms=5&gap_ms=1"
    figures: list[Figure] = []
    with FastSSEProcess(FastSSEConfig(events=8), cpu=_server_cpu()) as srv:
        # Calibrate the generator's CPU per request on this machine, then pick rates for the target shares.
        cal = _run(srv.url, LoadSpec(model="poisson", rate=200, warmup_s=0.5, duration_s=2.0, seed=99), path=path)
        cpu_per_req = max(1e-6, _cpu_share(cal.summary()) / 200)
        for share in (0.10, 0.50, 0.80):
            rate = round(share / cpu_per_req)
            since = _last_seq(srv.url)
            res = _run(srv.url, LoadSpec(model="poisson", rate=rate, warmup_s=1.0, duration_s=4.0, seed=7),
                       path=path)
            s = res.summary()
            truth = _ground_truth(srv.url, since)
            ttft_err, e2e_err = _errors(res, truth)
            tag = f"{round(share * 100)}pct"
            note = f"{rate}/s open loop; n={len(ttft_err)}; verdict {s['selfcheck']['verdict']}"
            figures += [
                Figure(f"measurement_gen_cpu_{tag}", _cpu_share(s), "share", note),
                Figure(f"measurement_foreign_cpu_{tag}", s["foreign_cpu_gen_core"], "share",
                       "generator core's CPU used by other processes during the run"),
                Figure(f"measurement_ttft_error_p50_{tag}", percentile(ttft_err, 50), "ms", note),
                Figure(f"measurement_ttft_error_p99_{tag}", percentile(ttft_err, 99), "ms", note),
                Figure(f"measurement_e2e_error_p50_{tag}", percentile(e2e_err, 50), "ms", note),
                Figure(f"measurement_e2e_error_p99_{tag}", percentile(e2e_err, 99), "ms", note),
            ]
    return figures


def _errors(res: Any, truth: dict[str, dict[str, Any]]) -> tuple[list[float], list[float]]:
    """Per steady, successful request: probe's first-token stamp − server's first write, and probe's [DONE]
    stamp − server's last write (both CLOCK_MONOTONIC on this host), in ms, sorted."""
    from csbench.probe.engine.records import P_STEADY

    rec = res.records
    c = rec.cols
    ttft, e2e = [], []
    for i in range(rec.n):
        if c["phase"][i] != P_STEADY or c["error"][i] or not c["t_first_token"][i]:
            continue
        t = truth.get(rec.server_id[i] or "")
        if t is None or not t["first_write_ns"]:
            continue
        ttft.append((c["t_first_token"][i] - t["first_write_ns"]) * MS)
        e2e.append((c["t_end"][i] - t["end_ns"]) * MS)
    if not ttft:
        raise RuntimeError("no probe record matched the server's ground truth (x-request-id)")
    return sorted(ttft), sorted(e2e)


@bench("measurement_stall")
def measurement_stall() -> list[Figure]:
    """A 1 s stall of every response, 3 s into an 8 s run: open loop (latency from the intended send)
    against closed loop (latency from the actual send, as most load tools measure)."""
    from csbench.probe.engine.load import LoadSpec

    path = CHAT + "?ttft_ms=5"
    figures: list[Figure] = []
    with FastSSEProcess(FastSSEConfig(events=8), cpu=_server_cpu()) as srv:
        for name, load in (("open", LoadSpec(model="poisson", rate=300, warmup_s=1.0, duration_s=7.0, seed=3)),
                           ("closed", LoadSpec(model="closed", concurrency=4, warmup_s=1.0, duration_s=7.0))):
            # the run starts 50 ms after run_load is entered; the stall begins 3 s into it
            threading.Timer(0.05 + 3.0, _http, (f"{srv.url}/-/stall", {"seconds": 1.0})).start()
            s = _run(srv.url, load, path=path).summary()
            lat = s["latency_ms"]
            metric = "ttft" if name == "open" else "ttft_service"  # what each style reports
            figures += [
                Figure(f"measurement_stall_{name}_ttft_p99", lat[metric]["p99"], "ms",
                       f"{metric}; 1 s stall; {s['counts']['completed']} completed; verdict "
                       f"{s['selfcheck']['verdict']}; foreign CPU on the generator core "
                       f"{s['foreign_cpu_gen_core']:.2f}"),
                Figure(f"measurement_stall_{name}_ttft_p50", lat[metric]["p50"], "ms", metric),
            ]
    return figures
