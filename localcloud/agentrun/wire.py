"""The OpenAI chat-completions wire format: request checks, error bodies, pre-encoded SSE chunks.

Hand-written rather than pydantic because it runs on every request at thousands per second; the checks
cover what a client can get wrong (types, required fields) and name the offending parameter the way
OpenAI does (`param` in the error object).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


class ApiError(Exception):
    """An OpenAI-style error response: `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None):  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type, "param": param, "code": code}}).encode()


def _bad(message: str, param: str | None, code: str = "invalid_type") -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass(slots=True)
class ChatRequest:
    stream: bool
    include_usage: bool
    max_tokens: int | None
    prompt_tokens: int
    last_user: str | None = None  # content of the last user message, when it is a string


def _int_field(doc: dict[str, Any], name: str) -> int | None:
    v = doc.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(f"Invalid type for '{name}': expected an integer, but got {type(v).__name__}.", name)
    if v < 1:
        raise _bad(f"Invalid '{name}': integer below minimum value. Expected a value >= 1, but got {v}.", name,
                   "integer_below_min_value")  # fmt: skip
    return v


def parse_chat_request(raw: bytes) -> ChatRequest:
    """Check a chat-completions body; raise ApiError(400) naming the first problem found."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise _bad(f"We could not parse the JSON body of your request: {e}.", None, "invalid_json") from None
    if not isinstance(doc, dict):
        raise _bad(f"The request body must be a JSON object, not {type(doc).__name__}.", None, "invalid_json")
    messages = doc.get("messages")
    if messages is None:
        raise _bad("Missing required parameter: 'messages'.", "messages", "missing_required_parameter")
    if not isinstance(messages, list):
        raise _bad(
            f"Invalid type for 'messages': expected an array, but got {type(messages).__name__}.", "messages"
        )
    if not messages:
        raise _bad("Invalid 'messages': empty array. Expected an array with minimum length 1.", "messages",
                   "empty_array")  # fmt: skip
    chars = 0
    last_user = None
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(f"Invalid type for '{where}': expected an object, but got {type(m).__name__}.", where)
        role = m.get("role")
        if role is None:
            raise _bad(
                f"Missing required parameter: '{where}.role'.", f"{where}.role", "missing_required_parameter"
            )
        if not isinstance(role, str) or role not in _ROLES:
            raise _bad(f"Invalid value for '{where}.role': {role!r}. Supported values are: "
                       f"{', '.join(sorted(_ROLES))}.", f"{where}.role", "invalid_value")  # fmt: skip
        content = m.get("content")
        if isinstance(content, str):
            chars += len(content)
            if role == "user":
                last_user = content
        elif isinstance(content, list):
            chars += sum(
                len(p.get("text", ""))
                for p in content
                if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
        elif content is not None:
            raise _bad(f"Invalid type for '{where}.content': expected a string or an array, but got "
                       f"{type(content).__name__}.", f"{where}.content")  # fmt: skip
    stream = doc.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad(
            f"Invalid type for 'stream': expected a boolean, but got {type(stream).__name__}.", "stream"
        )
    model = doc.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad(f"Invalid type for 'model': expected a string, but got {type(model).__name__}.", "model")
    include_usage = False
    opts = doc.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict):
            raise _bad(f"Invalid type for 'stream_options': expected an object, but got {type(opts).__name__}.",
                       "stream_options")  # fmt: skip
        if not stream:
            raise _bad("The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options",
                       "invalid_value")  # fmt: skip
        iu = opts.get("include_usage", False)
        if not isinstance(iu, bool):
            raise _bad("Invalid type for 'stream_options.include_usage': expected a boolean.",
                       "stream_options.include_usage")  # fmt: skip
        include_usage = iu
    max_tokens = _int_field(doc, "max_completion_tokens") or _int_field(doc, "max_tokens")
    return ChatRequest(stream, include_usage, max_tokens, max(1, chars // 4), last_user)


# A fixed vocabulary: content is deterministic, JSON-safe and cheap; each entry is one "token".
WORDS = ("Local", " cloud", " agent", " says", " hello", " from", " the", " target", ".")


class Codec:
    """Pre-encoded pieces of every SSE event; per request only the id and created time are spliced in."""

    def __init__(self, model: str):
        self.model = model
        self._model = json.dumps(model).encode()
        self.deltas = tuple(b'{"content":' + json.dumps(w).encode() + b"}" for w in WORDS)
        self.role_delta = b'{"role":"assistant","content":""}'
        self.role_token_deltas = tuple(
            b'{"role":"assistant","content":' + json.dumps(w).encode() + b"}" for w in WORDS
        )
        self.tail = b',"logprobs":null,"finish_reason":null}]}\n\n'
        self.tail_usage = b',"logprobs":null,"finish_reason":null}],"usage":null}\n\n'
        self.done = b"data: [DONE]\n\n"

    def head(self, completion_id: str, created: int) -> bytes:
        return (b'data: {"id":"' + completion_id.encode() + b'","object":"chat.completion.chunk","created":'
                + str(created).encode() + b',"model":' + self._model
                + b',"system_fingerprint":null,"choices":[{"index":0,"delta":')  # fmt: skip

    def final(self, head: bytes, finish: str, usage: dict[str, int] | None) -> bytes:
        out = head + b'{},"logprobs":null,"finish_reason":"' + finish.encode() + b'"}]'
        if usage is None:
            return out + b"}\n\n" + self.done
        # The usage chunk repeats id/created/model with empty choices (OpenAI's include_usage shape).
        usage_head = head[: head.index(b',"choices":')]
        return (out + b',"usage":null}\n\n' + usage_head + b',"choices":[],"usage":'
                + json.dumps(usage, separators=(",", ":")).encode() + b"}\n\n" + self.done)  # fmt: skip

    @staticmethod
    def text(n_tokens: int) -> str:
        return "".join(WORDS[i % len(WORDS)] for i in range(n_tokens))

    @staticmethod
    def custom(text: str) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
        """(deltas, first deltas) for a one-token answer with arbitrary text (the agent's tool result)."""
        t = json.dumps(text).encode()
        return (b'{"content":' + t + b"}",), (b'{"role":"assistant","content":' + t + b"}",)

    def completion(self, completion_id: str, created: int, text: str, finish: str,
                   usage: dict[str, int]) -> bytes:  # fmt: skip
        return json.dumps({
            "id": completion_id, "object": "chat.completion", "created": created, "model": self.model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                         "logprobs": None, "finish_reason": finish}],
            "usage": usage,
        }).encode()  # fmt: skip
