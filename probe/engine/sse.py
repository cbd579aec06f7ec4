"""text/event-stream framing and OpenAI chunk classification. Pure: the caller supplies arrival times.

The framer works on bytes and is fed whatever `iter_any()` returned; every event completed by one feed
gets that feed's arrival time (we never invent spacing between events that arrived together).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

# Event kinds, as small ints so records can keep them in arrays.
K_COMMENT = 0  # a block with only comment lines (":" heartbeat) or no data
K_DATA = 1  # data with no generated output (role-only delta, finish chunk, status/metadata event)
K_TOKEN = 2  # carries generated output: reasoning or tool-call arguments
K_CONTENT = 3  # carries user-visible answer content (also a token)
K_DONE = 4  # the terminal `[DONE]`
K_ERROR = 5  # an error object mid-stream


@dataclass(slots=True)
class SseEvent:
    event: str  # the `event:` field, "" when absent
    data: str | None  # `data:` lines joined with "\n"; None for comment-only blocks


class SseFramer:
    """Incremental framer: blank line ends an event; CRLF, CR and LF are all line ends (per the spec)."""

    __slots__ = ("_buf", "_cr")

    def __init__(self) -> None:
        self._buf = b""
        self._cr = False  # the previous chunk ended in "\r": a "\n" starting this one belongs to it

    def feed(self, chunk: bytes) -> list[SseEvent]:
        return [parse_block(b) for b in self.blocks(chunk)]

    def blocks(self, chunk: bytes) -> list[bytes]:
        """The raw blocks (events, LF line ends, no terminating blank line) completed by this chunk — the
        hot path: the client classifies blocks without building an SseEvent (`classify_block_*`)."""
        if self._cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._cr = chunk[-1:] == b"\r"
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf + chunk if self._buf else chunk
        if b"\n\n" not in buf:
            self._buf = buf
            return []
        *blocks, self._buf = buf.split(b"\n\n")
        if b"" in blocks:
            return [b for b in blocks if b]
        return blocks

    @property
    def pending(self) -> int:
        """Bytes of an incomplete event still buffered (non-zero at EOF ⇒ the stream was cut mid-event)."""
        return len(self._buf.strip(b"\n"))


def parse_block(block: bytes) -> SseEvent:
    event = ""
    data: list[str] = []
    for raw in block.split(b"\n"):
        if not raw or raw[:1] == b":":
            continue
        line = raw.decode("utf-8", errors="replace")
        name, sep, value = line.partition(":")
        if sep and value[:1] == " ":
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
    return SseEvent(event, "\n".join(data) if data else None)


@dataclass(slots=True)
class Classified:
    kind: int
    usage_tokens: int | None = None  # usage.completion_tokens when the event carries it
    finish: bool = False  # a choice with finish_reason


def classify_openai(ev: SseEvent) -> Classified:
    """Kind of an OpenAI chat.completion.chunk. Raises ValueError on a non-JSON data payload."""
    data = ev.data
    if data is None:
        return Classified(K_COMMENT)
    if data == "[DONE]":
        return Classified(K_DONE)
    if not data.strip():
        return Classified(K_COMMENT)
    try:
        doc = json.loads(data)
    except json.JSONDecodeError as exc:
        raise ValueError(f"SSE data is not JSON: {data[:80]!r}") from exc
    if not isinstance(doc, dict):
        raise ValueError(f"SSE data is not a JSON object: {data[:80]!r}")
    if doc.get("error") or ev.event == "error":
        return Classified(K_ERROR)
    kind = K_DATA
    finish = False
    for choice in doc.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content"):
            kind = K_CONTENT
        elif kind < K_TOKEN and (
            delta.get("reasoning_content") or delta.get("reasoning") or _tool_args(delta.get("tool_calls"))
        ):
            kind = K_TOKEN
        if choice.get("finish_reason"):
            finish = True
    usage = doc.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return Classified(kind, tokens if isinstance(tokens, int) else None, finish)


def _tool_args(calls: object) -> bool:
    if not isinstance(calls, list):
        return False
    return any(isinstance(c, dict) and (c.get("function") or {}).get("arguments") for c in calls)


def classify_generic(ev: SseEvent) -> Classified:
    """kind=http streams: any non-empty data event is output (token_source=events); `[DONE]` ends it."""
    if ev.data is None or not ev.data.strip():
        return Classified(K_COMMENT)
    if ev.data == "[DONE]":
        return Classified(K_DONE)
    if ev.event == "error":
        return Classified(K_ERROR)
    return Classified(K_CONTENT)


# --- hot path: classify a raw block without decoding JSON when a byte search is unambiguous ---------------
#
# Per event, `parse_block` + `json.loads` + the dict walk cost ~7 µs on the dev VM, and most events of a
# stream are plain content deltas. `classify_block_openai` answers K_CONTENT from byte searches when the
# block is one `data: {...}` line with exactly one `"content"` key, whose value is a non-empty string
# written `"content":"x…` inside a `"delta":{…}`, and no error / reasoning* / tool_calls / usage key other
# than `…:null`. Everything else (role-only and finish chunks, usage, errors, reasoning and tool tokens,
# `event:` lines, multi-line data, whitespace around colons, several "content" keys) takes the full
# decoding path `classify_openai(parse_block(block))`, so the decision is always the same as the full path.
# What the shortcut gives up: a content chunk of that exact shape that is malformed JSON elsewhere
# (e.g. `{"delta":{"content":"x"}` missing a brace in the middle) is counted as a token instead of a
# `protocol` error. `[DONE]` is matched exactly.

_R_DONE = (K_DONE, None)
_R_CONTENT = (K_CONTENT, None)
_R_COMMENT = (K_COMMENT, None)
# Keys that can change the outcome (error, reasoning/tool tokens, usage) unless their value is `null`.
_SLOW_KEY = re.compile(rb'"(?:error|reasoning[A-Za-z_]*|tool_calls|usage)"(?!:null[,}])')


def classify_block_openai(block: bytes) -> tuple[int, int | None]:
    """(kind, usage.completion_tokens or None) of one raw block; same answer as
    `classify_openai(parse_block(block))`. Raises ValueError on a non-JSON payload (via the full path)."""
    if block[:7] == b"data: {" and block[-1:] == b"}" and b"\n" not in block:
        j = block.find(b'"content":"', 7)
        if (
            j > 0
            and block[j + 11 : j + 12] != b'"'
            and block.find(b'"content"', j + 9) < 0
            and 0 < block.find(b'"delta":{', 7) < j
            and _SLOW_KEY.search(block, 6) is None
        ):
            return _R_CONTENT
    elif block == b"data: [DONE]":
        return _R_DONE
    c = classify_openai(parse_block(block))
    return c.kind, c.usage_tokens


def classify_block_generic(block: bytes) -> tuple[int, int | None]:
    """Same answer as `classify_generic(parse_block(block))`, without building the event for one data line."""
    if block[:5] == b"data:" and b"\n" not in block:
        p = block[6:] if block[5:6] == b" " else block[5:]
        if not p.strip():
            return _R_COMMENT
        if p == b"[DONE]":
            return _R_DONE
        return _R_CONTENT
    c = classify_generic(parse_block(block))
    return c.kind, c.usage_tokens
