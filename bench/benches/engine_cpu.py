"""What one request costs the measurement engine, in CPU time of the generator process (not wall time).

fastsse (localcloud/agentrun/fastsse.py) runs pinned to SERVER_CPU; the engine (`run_load`, aiohttp +
uvloop, like the carrier) runs here with its thread pinned to GEN_CPU. Each scenario is an open loop at a
fixed moderate rate (constant grid, so every repeat offers the same requests). The process CPU time
(`time.process_time_ns`, all threads of this process) is read at every ~1 s progress tick; the figure is
the CPU spent between the first and the last tick inside the steady window, divided by the requests whose
intended time falls in the same interval. So start-up, the pre-run `gc.collect()`, warm-up and the drain
are excluded, while everything the engine does per second in steady state — the monitor's lag probe, the
dispatcher, the phase ticker — is included, amortised over the requests of that rate.

- engine_cpu_per_request_us_short8: 8 content chunks + usage + [DONE] in one write (one read per request);
- engine_cpu_per_request_us_paced16: 16 chunks 1 ms apart after a 5 ms first-event delay (≈ 18 reads);
- engine_cpu_idle_share: CPU share of the engine at 2 req/s (its fixed cost per second);
- engine_ttft_obs_error_{p50,p99}: first-token stamp − server's write stamp at a low rate (paced stream).

Each figure is the median of REPEATS runs; the note holds every run (spread). See docs/measurement.md.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from benches import Figure, bench, percentile
from benches.measurement import CHAT, GEN_CPU, _errors, _ground_truth, _last_seq, _pinned, _server_cpu
from csbench.localcloud.agentrun.fastsse import FastSSEConfig, FastSSEProcess

RATE = 400  # req/s: moderate — well below saturation, high enough that fixed costs do not dominate
WARMUP_S, STEADY_S = 1.0, 6.0
REPEATS = 3
SCENARIOS = (
    ("short8", CHAT + "?events=8"),
    ("paced16", CHAT + "?events=16&ttft_ms=5&gap_ms=1"),
)


def _measure(url: str, path: str, rate: float, steady_s: float = STEADY_S, seed: int = 0) -> dict[str, Any]:
    """One open-loop run; CPU µs per steady request and the RunResult."""
    import uvloop

    from csbench.probe.engine.client import Timeouts
    from csbench.probe.engine.load import LoadSpec
    from csbench.probe.engine.requests import OpenAIBody
    from csbench.probe.engine.run import run_load
    from csbench.probe.protocol import Limits, Target

    ticks: list[tuple[str, int, int]] = []

    def progress(phase: str, done: int, total: int | None, metrics: dict[str, float]) -> None:
        ticks.append((phase, time.perf_counter_ns(), time.process_time_ns()))

    target = Target(url=url, path=path, model="fastsse")
    limits = Limits(max_concurrency=4000, max_rate_per_s=20_000, max_requests=1_000_000)
    load = LoadSpec(model="constant", rate=rate, warmup_s=WARMUP_S, duration_s=steady_s, cooldown_s=0.5,
                    seed=seed)
    with _pinned(GEN_CPU):
        res = uvloop.run(run_load(target, load, limits=limits, openai_body=OpenAIBody(max_tokens=16),
                                  on_progress=progress,
                                  timeouts=Timeouts(connect_s=5, ttft_s=10, idle_s=10, total_s=15)))
    steady = [(t, c) for ph, t, c in ticks if ph == "measuring"]
    if len(steady) < 2:
        raise RuntimeError(f"too few progress ticks in the steady window: {ticks!r}")
    (ta, ca), (tb, cb) = steady[0], steady[-1]
    rec = res.records
    ti = rec.cols["t_intended"]
    n = sum(1 for i in range(rec.n) if ta <= ti[i] < tb)
    errors = sum(1 for i in range(rec.n) if rec.cols["error"][i])
    if errors:
        raise RuntimeError(f"{errors} failed requests: the figure would not be a clean per-request cost")
    return {"us": (cb - ca) / 1000 / max(1, n), "share": (cb - ca) / (tb - ta), "n": n, "res": res}


def _median(values: list[float]) -> tuple[float, str]:
    return statistics.median(values), "runs " + ", ".join(f"{v:.1f}" for v in values) + (
        f"; spread {min(values):.1f}–{max(values):.1f}")


@bench("engine_cpu")
def engine_cpu() -> list[Figure]:
    figures: list[Figure] = []
    with FastSSEProcess(FastSSEConfig(events=8), cpu=_server_cpu()) as srv:
        _measure(srv.url, SCENARIOS[0][1], RATE, steady_s=2.0)  # warm the interpreter, sockets and server
        for name, path in SCENARIOS:
            runs = [_measure(srv.url, path, RATE, seed=k) for k in range(REPEATS)]
            med, note = _median([r["us"] for r in runs])
            verdicts = ",".join(r["res"].summary()["selfcheck"]["verdict"] for r in runs)
            figures.append(Figure(f"engine_cpu_per_request_us_{name}", med, "us",
                                  f"{RATE}/s constant open loop, process CPU per steady request, median of "
                                  f"{REPEATS}: {note}; CPU share {statistics.median(r['share'] for r in runs):.3f}; "
                                  f"verdicts {verdicts}"))
        idle = [_measure(srv.url, SCENARIOS[0][1], 2.0, steady_s=4.0, seed=k)["share"] for k in range(REPEATS)]
        med, note = _median([x * 100 for x in idle])
        figures.append(Figure("engine_cpu_idle_share", med / 100, "share",
                              f"CPU share at 2 req/s (fixed per-second cost), percent: {note}"))
        # Measurement truth: observation delay of the first token at a low rate (paced stream).
        since = _last_seq(srv.url)
        run = _measure(srv.url, SCENARIOS[1][1], 50.0, steady_s=6.0, seed=11)
        ttft_err, _ = _errors(run["res"], _ground_truth(srv.url, since))
        note = f"50/s paced16, n={len(ttft_err)}, probe first-token stamp − server srv_ns of that write"
        figures += [
            Figure("engine_ttft_obs_error_p50", percentile(ttft_err, 50), "ms", note),
            Figure("engine_ttft_obs_error_p99", percentile(ttft_err, 99), "ms", note),
        ]
    return figures
