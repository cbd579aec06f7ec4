"""text/event-stream framing and OpenAI chunk classification. Pure: the caller supplies arrival times.

The framer works on bytes and is fed whatever `iter_any()` returned; every event completed by one feed
gets that feed's arrival time (we never invent spacing between events that arrived together).
"""

from __future__ import annotations

import json
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
        if self._cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._cr = chunk[-1:] == b"\r"
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf + chunk
        if b"\n\n" not in buf:
            self._buf = buf
            return []
        *blocks, self._buf = buf.split(b"\n\n")
        return [parse_block(b) for b in blocks if b]

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
