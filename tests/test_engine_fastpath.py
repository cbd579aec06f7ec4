"""The engine's hot-path shortcuts must give exactly the answers of the full (decoding) paths."""

from __future__ import annotations

import asyncio

import pytest

from csbench.probe.engine.monitor import Monitor
from csbench.probe.engine.requests import RequestBuilder
from csbench.probe.engine.sse import (
    SseFramer,
    classify_block_generic,
    classify_block_openai,
    classify_generic,
    classify_openai,
    parse_block,
)
from csbench.probe.protocol import Target

PAYLOADS = [
    '{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok1 "},"finish_reason":null}]}',
    '{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}',
    '{"choices":[{"index":0,"delta":{"role":"assistant","content":null,"refusal":null}}],"usage":null}',
    '{"choices":[{"index":0,"delta":{"content":"x"}}],"usage":null}',
    '{"choices":[{"index":0,"delta":{"content":"\\"content\\": \\"error\\""}}]}',
    '{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}',
    '{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7,"total_tokens":10}}',
    '{"choices":[{"delta":{"reasoning_content":"hm"}}]}',
    '{"choices":[{"delta":{"reasoning":"hm","content":""}}]}',
    '{"choices":[{"delta":{"reasoning_content":null,"content":"a"}}]}',
    '{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}',
    '{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"f"}}]}}]}',
    '{"error":{"message":"boom"}}',
    '{"error":null,"choices":[{"delta":{"content":"a"}}]}',
    '{"choices":[{"delta":{"content": "spaced"}}]}',
    '{"choices":[{"delta":{"content" :""}}]}',
    '{"choices":[{"delta":{"content":""}},{"delta":{"content":"second"}}]}',
    '{"choices":[{"delta":{"content":"a"},"logprobs":{"content":[]}}]}',
    '{"choices":[{"message":{"content":"not a delta"}}]}',
    '{"choices": [ {"delta": {"content": ""} } ]}',
    '{"choices":[{"delta":{"content":"a"}}], "usage": {"completion_tokens": 2}}',
    "[DONE]",
    "",
    "   ",
]


def _full(block: bytes, openai: bool) -> tuple[int, int | None]:
    c = (classify_openai if openai else classify_generic)(parse_block(block))
    return c.kind, c.usage_tokens


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("prefix", ["data: ", "data:", "event: error\ndata: ", ": hb\ndata: ", "event: x\ndata: "])
def test_block_classifiers_match_full_path(payload: str, prefix: str) -> None:
    block = (prefix + payload).encode()
    for openai, fast in ((True, classify_block_openai), (False, classify_block_generic)):
        try:
            want = _full(block, openai)
        except ValueError:
            with pytest.raises(ValueError):
                fast(block)
            continue
        assert fast(block) == want, (openai, block)


def test_block_classifier_comment_and_multiline() -> None:
    for block in (b": heartbeat", b"data: a\ndata: b", b"event: status", b"data", b"data: {nope}"):
        for openai, fast in ((True, classify_block_openai), (False, classify_block_generic)):
            try:
                want = _full(block, openai)
            except ValueError:
                with pytest.raises(ValueError):
                    fast(block)
                continue
            assert fast(block) == want, block


def test_non_json_still_a_protocol_error() -> None:
    with pytest.raises(ValueError):
        classify_block_openai(b"data: not json")
    with pytest.raises(ValueError):
        classify_block_openai(b'data: {"choices":')


def test_framer_blocks_equal_feed() -> None:
    stream = b": hb\r\n\r\ndata: {\"a\":1}\n\n\n\ndata: x\rdata: y\r\rdata: [DONE]\n\n"
    for cut in range(1, len(stream)):
        a, b = SseFramer(), SseFramer()
        evs = a.feed(stream[:cut]) + a.feed(stream[cut:])
        blocks = b.blocks(stream[:cut]) + b.blocks(stream[cut:])
        assert [parse_block(x) for x in blocks] == evs
        assert all(blocks) and a.pending == b.pending == 0


def test_builder_cache_per_session_is_bounded_and_exact() -> None:
    t = Target(url="http://127.0.0.1:1", path="/v1/chat/completions", model="m")
    b = RequestBuilder(t, credential_headers={"Authorization": "Bearer x"})
    r1, r2 = b.build("s1", 0), b.build("s1", 1)
    assert r1 is r2 and r1.headers[t.session_header] == "s1"
    assert b.build("s2", 2).headers[t.session_header] == "s2"
    for k in range(5000):
        assert b.build(f"p{k}", k).headers[t.session_header] == f"p{k}"
    assert len(b._by_session) <= 4096


def test_monitor_lag_probe_timer() -> None:
    async def main() -> Monitor:
        m = Monitor(lag_probe_s=0.005)
        m.start()
        await asyncio.sleep(0.1)
        loop = asyncio.get_running_loop()
        t_block = loop.time()
        while loop.time() - t_block < 0.03:  # block the loop for 30 ms: the probe must see it
            pass
        await asyncio.sleep(0.02)
        await m.stop()
        return m

    m = asyncio.run(main())
    assert 10 <= len(m.lag_ns) <= 30
    assert list(m.lag_t) == sorted(m.lag_t)
    assert max(m.lag_ns) >= 20_000_000
    assert all(x >= 0 for x in m.lag_ns)
