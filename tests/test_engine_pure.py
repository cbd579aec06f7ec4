"""Measurement engine, pure parts: schedules, statistics, self-check rules, SSE framing, classification,
request building, clamping. No network, no clock."""

from __future__ import annotations

import math
import random
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import pytest

from csbench.probe.engine.client import parse_retry_after, status_error
from csbench.probe.engine.load import (
    NS,
    LoadSpec,
    Sweep,
    arrivals,
    constant_arrivals,
    phase_of,
    poisson_arrivals,
    sweep_should_stop,
    sweep_steps,
    think_times,
)
from csbench.probe.engine.records import Records
from csbench.probe.engine.requests import HttpTemplate, OpenAIBody, RequestBuilder, resolve_credentials
from csbench.probe.engine.run import clamp, split_load
from csbench.probe.engine.selfcheck import Thresholds, WindowSignals, combine, evaluate
from csbench.probe.engine.sse import (
    K_CONTENT,
    K_DATA,
    K_DONE,
    K_ERROR,
    K_TOKEN,
    SseEvent,
    SseFramer,
    classify_openai,
)
from csbench.probe.engine.stats import (
    ci_ranks,
    describe,
    hdr_encode,
    hdr_merge,
    hdr_percentile_ms,
    nearest_rank,
    wilson,
)
from csbench.probe.protocol import Limits, Target

# --- schedules -------------------------------------------------------------------------------------------


def test_constant_schedule_is_exact() -> None:
    a = constant_arrivals(4, 1.0)
    assert list(a) == [0, NS // 4, NS // 2, 3 * NS // 4]
    assert len(constant_arrivals(1000, 2.0)) == 2000


def test_poisson_is_seeded_and_has_the_rate() -> None:
    a, b = poisson_arrivals(500, 10, seed=3), poisson_arrivals(500, 10, seed=3)
    assert a == b and a != poisson_arrivals(500, 10, seed=4)
    assert list(a) == sorted(a) and a[-1] < 10 * NS and a[0] > 0
    assert abs(len(a) / 10 - 500) < 4 * math.sqrt(5000) / 10  # within 4 sd of the count
    gaps = [(y - x) / NS for x, y in zip(a, a[1:], strict=False)]
    cv = (sum((g - 1 / 500) ** 2 for g in gaps) / len(gaps)) ** 0.5 * 500
    assert 0.9 < cv < 1.1  # exponential gaps: coefficient of variation 1


def test_burst_and_max_requests_and_phases() -> None:
    spec = LoadSpec(model="burst", burst_size=3, bursts=2, burst_interval_s=0.5)
    assert list(arrivals(spec)) == [0, 0, 0, NS // 2, NS // 2, NS // 2]
    assert len(arrivals(LoadSpec(model="constant", rate=100, duration_s=1, max_requests=7))) == 7
    spec = LoadSpec(model="constant", rate=10, warmup_s=1, duration_s=2, cooldown_s=1)
    assert [phase_of(int(t * NS), spec) for t in (0, 0.99, 1, 2.99, 3, 3.5)] == [0, 0, 1, 1, 2, 2]
    assert len(arrivals(spec)) == 40  # load runs through all three phases
    with pytest.raises(ValueError, match="load model"):
        LoadSpec(model="gamma")
    with pytest.raises(ValueError, match="unknown keys"):
        LoadSpec.from_params({"rate": 1, "rps": 2})


def test_think_times_are_seeded() -> None:
    t = think_times("exponential", 0.1, 5)
    xs = [next(t) for _ in range(2000)]
    t2 = think_times("exponential", 0.1, 5)
    assert xs[:10] == [next(t2) for _ in range(10)]
    assert abs(sum(xs) / len(xs) / NS - 0.1) < 0.01
    assert next(think_times("constant", 0.25, 0)) == NS // 4 and next(think_times("constant", 0, 0)) == 0


def test_sweeps_and_early_stop() -> None:
    sw = Sweep(
        LoadSpec(model="poisson", seed=1), (10, 20, 40), stop_error_fraction=0.05, stop_429_fraction=0.01
    )
    steps = sweep_steps(sw)
    assert [s.rate for s in steps] == [10, 20, 40] and len({s.seed for s in steps}) == 3
    assert sweep_should_stop({"sent": 100, "errors": {"http_429": 1}}, sw) is None
    assert "429" in (sweep_should_stop({"sent": 100, "errors": {"http_429": 2}}, sw) or "")
    assert "error" in (sweep_should_stop({"sent": 100, "errors": {"http_5xx": 6}}, sw) or "")
    closed = sweep_steps(Sweep(LoadSpec(model="closed"), (1, 2, 4)))
    assert [s.concurrency for s in closed] == [1, 2, 4]


def test_split_load_superposes_to_the_whole() -> None:
    spec = LoadSpec(model="closed", concurrency=5, max_requests=11, max_inflight=3)
    parts = [split_load(spec, 2, k) for k in range(2)]
    assert [p.concurrency for p in parts] == [3, 2] and [p.max_requests for p in parts] == [6, 5]
    pois = [split_load(LoadSpec(rate=100, seed=1), 4, k) for k in range(4)]
    assert {p.rate for p in pois} == {25} and len({p.seed for p in pois}) == 4


def test_clamp_reports_every_clamp() -> None:
    lim = Limits(max_concurrency=4, max_rate_per_s=50, max_requests=100)
    eff, clamps = clamp(LoadSpec(model="poisson", rate=200, max_inflight=10, max_requests=500), lim, 20.0)
    assert (eff.rate, eff.max_inflight, eff.max_requests) == (50, 4, 100)
    assert {c["param"] for c in clamps} == {"rate", "max_inflight", "max_requests"}
    assert clamps[0] == {"param": "rate", "asked": 200, "used": 50, "limit": 50}
    eff, clamps = clamp(LoadSpec(model="closed", concurrency=9, warmup_s=2, duration_s=10), lim, 5.0)
    assert eff.concurrency == 4 and eff.duration_s == 3.0 and eff.total_s == 5.0
    eff, clamps = clamp(LoadSpec(model="poisson", rate=10), lim)
    assert clamps == [] and eff.max_inflight == 4  # the limit becomes the in-flight cap, silently


# --- statistics -------------------------------------------------------------------------------------------


def test_nearest_rank_against_brute_force() -> None:
    rng = random.Random(1)
    for n in (1, 2, 7, 100, 1001):
        xs = sorted(rng.random() for _ in range(n))
        for q in (0.5, 0.9, 0.99, 0.999):
            v = nearest_rank(xs, q)
            # definition: the smallest x with at least q·n samples ≤ x
            brute = min(x for x in xs if sum(1 for y in xs if y <= x) >= q * n)
            assert v == brute


def _binom_cdf(n: int, q: float, k: int) -> float:
    return sum(math.comb(n, j) * q**j * (1 - q) ** (n - j) for j in range(k + 1))


def test_order_statistic_cis_cover_and_match_the_spec() -> None:
    for n, q in [(100, 0.5), (100, 0.9), (1000, 0.5), (1000, 0.99), (400, 0.99)]:
        lo, hi = ci_ranks(n, q)
        # exact coverage P(x_(lo) ≤ ξ ≤ x_(hi)) = P(lo ≤ B ≤ hi−1) ≥ 95 %, each tail ≤ 2.5 %
        assert _binom_cdf(n, q, lo - 1) <= 0.025 and 1 - _binom_cdf(n, q, hi - 1) <= 0.025
        assert _binom_cdf(n, q, hi - 1) - _binom_cdf(n, q, lo - 1) >= 0.95
        # and they are tight: moving either end inwards breaks its tail bound
        assert _binom_cdf(n, q, lo) > 0.025 and 1 - _binom_cdf(n, q, hi - 2) > 0.025
    # load_anchors §4.6 ranks (its lower ends are one rank more optimistic: ±1 by convention)
    assert ci_ranks(1000, 0.5) == (469, 532) and ci_ranks(1000, 0.99)[1] == 997
    assert ci_ranks(10_000, 0.99)[1] == 9920
    assert ci_ranks(100, 0.99) is None and ci_ranks(367, 0.99) is None and ci_ranks(368, 0.99) is not None
    assert ci_ranks(3000, 0.999) is None and ci_ranks(3700, 0.999) is not None


def test_describe_and_insufficient() -> None:
    d = describe([float(x) for x in range(1, 101)])
    assert (d["n"], d["min"], d["p50"], d["p90"], d["p99"], d["max"]) == (100, 1, 50, 90, 99, 100)
    assert d["mean"] == 50.5 and abs(d["std"] - 29.011) < 0.001
    assert d["ci95"]["p50"] == [40.0, 61.0] and d["ci95"]["p99"] == "insufficient"
    assert describe([]) == {"n": 0}


def test_wilson() -> None:
    lo, hi = wilson(0, 100)
    assert lo == 0 and 0.036 < hi < 0.038
    lo, hi = wilson(50, 100)
    assert abs(lo - 0.4038) < 1e-3 and abs(hi - 0.5962) < 1e-3
    assert wilson(0, 0) == (0.0, 1.0)


def test_hdr_roundtrip_and_merge() -> None:
    a = [float(x) for x in range(1, 1001)]  # ms
    b = [float(x) for x in range(1001, 2001)]
    merged = hdr_merge([hdr_encode(a), hdr_encode(b), None])
    assert merged is not None
    assert abs(hdr_percentile_ms(merged, 0.5) - 1000) / 1000 < 0.002
    assert abs(hdr_percentile_ms(merged, 0.99) - 1980) / 1980 < 0.002


# --- self-check rules, each threshold both sides ---------------------------------------------------------


@pytest.mark.parametrize(
    ("signals", "verdict", "word"),
    [
        (WindowSignals(sched_lag_p99_ms=2.0, late_fraction=0.01), "valid", None),
        (WindowSignals(sched_lag_p99_ms=2.1, late_fraction=0.0), "warn", "schedule lag"),
        (WindowSignals(sched_lag_p99_ms=1.0, late_fraction=0.011), "warn", "late"),
        (WindowSignals(sched_lag_p99_ms=10.0), "warn", "schedule lag"),
        (WindowSignals(sched_lag_p99_ms=10.1), "invalid", "schedule lag"),
        (WindowSignals(sched_lag_p99_ms=15.0, ttft_p50_ms=1000.0), "warn", "20.00 ms"),  # 2 % of a 1 s TTFT
        (WindowSignals(offered=1000, sent=990), "valid", None),
        (WindowSignals(offered=1000, sent=989), "warn", "send rate"),
        (WindowSignals(offered=1000, sent=970), "warn", "send rate"),
        (WindowSignals(offered=1000, sent=969), "invalid", "send rate"),
        (WindowSignals(offered=1000, sent=1000, dropped=1), "valid", None),
        (WindowSignals(offered=1000, sent=1000, dropped=2), "invalid", "dropped"),
        (WindowSignals(loop_lag_p99_ms=2.0, loop_lag_max_ms=20.0), "valid", None),
        (WindowSignals(loop_lag_p99_ms=2.1, loop_lag_max_ms=3.0), "warn", "event-loop"),
        (WindowSignals(loop_lag_p99_ms=1.0, loop_lag_max_ms=21.0), "warn", "event-loop"),
        (WindowSignals(loop_lag_p99_ms=5.0, loop_lag_max_ms=100.0), "warn", "event-loop"),
        (WindowSignals(loop_lag_p99_ms=5.1, loop_lag_max_ms=6.0), "invalid", "event-loop"),
        (WindowSignals(loop_lag_p99_ms=1.0, loop_lag_max_ms=100.1), "invalid", "event-loop"),
        (WindowSignals(cpu_share=0.60), "valid", None),
        (WindowSignals(cpu_share=0.61), "warn", "CPU"),
        (WindowSignals(cpu_share=0.75), "warn", "CPU"),
        (WindowSignals(cpu_share=0.76), "invalid", "CPU"),
        (WindowSignals(gc_pause_max_ms=5.0), "valid", None),
        (WindowSignals(gc_pause_max_ms=5.1), "warn", "GC"),
        (WindowSignals(client_errors=0), "valid", None),
        (WindowSignals(client_errors=1), "invalid", "client-side"),
        (WindowSignals(little_deviation=0.05), "valid", None),
        (WindowSignals(little_deviation=0.06), "warn", "Little"),
        (WindowSignals(little_deviation=0.10), "warn", "Little"),
        (WindowSignals(little_deviation=0.11), "invalid", "Little"),
    ],
)
def test_selfcheck_rules(signals: WindowSignals, verdict: str, word: str | None) -> None:
    v, reasons = evaluate(signals, Thresholds())
    assert v == verdict, reasons
    if word is None:
        assert reasons == []
    else:
        assert len(reasons) == 1 and word in reasons[0] and reasons[0].startswith(verdict)


def test_selfcheck_combine_worst_wins() -> None:
    a = evaluate(WindowSignals(cpu_share=0.7))
    b = evaluate(WindowSignals(client_errors=2))
    v, reasons = combine([("valid", []), a, b])
    assert v == "invalid" and len(reasons) == 2


# --- SSE framing and classification ----------------------------------------------------------------------


def test_sse_events_split_across_reads_and_several_in_one() -> None:
    f = SseFramer()
    assert f.feed(b'data: {"a"') == []
    assert f.feed(b": 1}\n") == []
    evs = f.feed(b"\ndata: x\n\ndata: y\n\nda")
    assert [e.data for e in evs] == ['{"a": 1}', "x", "y"]
    assert f.pending == 2
    assert [e.data for e in f.feed(b"ta: z\n\n")] == ["z"] and f.pending == 0


def test_sse_crlf_cr_comments_multiline_and_event_field() -> None:
    f = SseFramer()
    evs = f.feed(b": heartbeat\r\n\r\nevent: status\r\ndata: a\r\ndata: b\r")
    assert [(e.event, e.data) for e in evs] == [("", None)]
    evs = f.feed(b"\n\r\ndata:nospace\r\rdata: [DONE]\n\n")  # CRLF split across reads; bare CR line ends
    assert [(e.event, e.data) for e in evs] == [("status", "a\nb"), ("", "nospace"), ("", "[DONE]")]


def _ev(doc: str) -> SseEvent:
    return SseEvent("", doc)


def test_openai_classification() -> None:
    role = '{"choices":[{"delta":{"role":"assistant"}}]}'
    assert classify_openai(_ev(role)).kind == K_DATA
    assert classify_openai(_ev('{"choices":[{"delta":{"content":""}}]}')).kind == K_DATA
    assert classify_openai(_ev('{"choices":[{"delta":{"content":"hi"}}]}')).kind == K_CONTENT
    assert classify_openai(_ev('{"choices":[{"delta":{"reasoning_content":"hm"}}]}')).kind == K_TOKEN
    tool = '{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"{\\"a"}}]}}]}'
    assert classify_openai(_ev(tool)).kind == K_TOKEN
    fin = classify_openai(_ev('{"choices":[{"delta":{},"finish_reason":"stop"}]}'))
    assert fin.kind == K_DATA and fin.finish
    assert classify_openai(_ev('{"choices":[],"usage":{"completion_tokens":7}}')).usage_tokens == 7
    assert classify_openai(_ev("[DONE]")).kind == K_DONE
    assert classify_openai(_ev('{"error":{"message":"boom"}}')).kind == K_ERROR
    assert classify_openai(SseEvent("", None)).kind == 0
    with pytest.raises(ValueError, match="not JSON"):
        classify_openai(_ev("{nope"))


# --- errors, requests, records -----------------------------------------------------------------------------


def test_retry_after_both_forms_and_status_classes() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
    assert parse_retry_after("3", now) == 3.0 and parse_retry_after("1.5", now) == 1.5
    assert parse_retry_after(format_datetime(now + timedelta(seconds=7), usegmt=True), now) == 7.0
    assert parse_retry_after(format_datetime(now - timedelta(seconds=7), usegmt=True), now) == 0.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert [status_error(s) for s in (200, 204, 400, 404, 429, 500, 503)] == [
        None, None, "http_4xx", "http_4xx", "http_429", "http_5xx", "http_5xx"]  # fmt: skip


def test_request_building_and_credentials() -> None:
    t = Target(url="http://127.0.0.1:1/", credential_ref="key1", headers={"X-A": "1"})
    creds = resolve_credentials(t, lambda ref: {"Authorization": f"Bearer secret-{ref}"})
    req = RequestBuilder(t, openai_body=OpenAIBody(prompt="p", max_tokens=3), credential_headers=creds).build(
        "s1", 0
    )
    assert req.url == "http://127.0.0.1:1/openai/v1/chat/completions" and req.stream and req.openai
    assert (
        req.headers["X-AgentRun-Session-ID"] == "s1" and req.headers["Authorization"] == "Bearer secret-key1"
    )
    assert (
        b'"stream":true' in req.body and b'"include_usage":true' in req.body and b'"max_tokens":3' in req.body
    )
    with pytest.raises(ValueError, match="credential"):
        resolve_credentials(t, None)
    h = Target(kind="http", url="http://127.0.0.1:1", session_header="")
    tpl = HttpTemplate.from_params(
        {
            "method": "put",
            "path": "/x/{session}",
            "headers": {"X-Seq": "{seq}"},
            "body": {"s": "{session}", "n": "{seq}"},
            "stream": True,
        }
    )
    req = RequestBuilder(h, http=tpl).build("abc", 7)
    assert (req.method, req.url, req.headers["X-Seq"]) == ("PUT", "http://127.0.0.1:1/x/abc", "7")
    assert req.body == b'{"s":"abc","n":"7"}' and req.stream and not req.openai


def test_records_grow_and_concat() -> None:
    r = Records(2)
    for k in range(5):
        i = r.add()
        r.cols["t_send"][i] = k + 1
        r.gap_req.append(i)
        r.gap_ns.append(10 * k)
    assert r.n == 5 and r.capacity >= 5 and list(r.t_send[:5]) == [1, 2, 3, 4, 5]
    assert r.row(0)["conn_reused"] is None and r.row(4)["t_send"] == 5
    m = Records.concat([r.export(), r.export()])
    assert m.n == 10 and list(m.gap_req) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]


def test_few_lag_probes_are_judged_by_their_max_not_a_p99_of_one_sample() -> None:
    from csbench.probe.engine.selfcheck import MIN_LAG_SAMPLES_FOR_P99, WindowSignals, evaluate

    few = MIN_LAG_SAMPLES_FOR_P99 - 1
    assert evaluate(WindowSignals(loop_lag_p99_ms=5.3, loop_lag_max_ms=5.3, loop_lag_samples=1))[0] == "warn"
    assert evaluate(WindowSignals(loop_lag_p99_ms=1.0, loop_lag_max_ms=1.5, loop_lag_samples=few))[0] == "valid"
    assert evaluate(WindowSignals(loop_lag_p99_ms=150, loop_lag_max_ms=150, loop_lag_samples=few))[0] == "invalid"
    # With enough probes the §4.7 p99 rule applies unchanged.
    enough = MIN_LAG_SAMPLES_FOR_P99
    assert evaluate(WindowSignals(loop_lag_p99_ms=5.3, loop_lag_max_ms=5.3, loop_lag_samples=enough))[0] == "invalid"


def test_littles_law_needs_enough_completions() -> None:
    from csbench.probe.engine.selfcheck import MIN_COMPLETIONS_FOR_LITTLE, WindowSignals, evaluate

    assert evaluate(WindowSignals(little_deviation=0.12, little_completions=7))[0] == "valid"
    assert evaluate(WindowSignals(little_deviation=0.12,
                                  little_completions=MIN_COMPLETIONS_FOR_LITTLE))[0] == "invalid"
