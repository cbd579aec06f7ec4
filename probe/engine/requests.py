"""What one request looks like on the wire, for each Target kind. Pure: no I/O, no clock.

Secrets never live here: `credential_headers` comes from the caller's resolver for target.credential_ref,
is merged into the headers at send time only, and is never part of a record or a log line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from csbench.probe.protocol import Target, TargetKind

# Resolves target.credential_ref to extra request headers (e.g. {"Authorization": "Bearer …"}).
CredentialResolver = Callable[[str], Mapping[str, str]]


@dataclass(frozen=True)
class HttpTemplate:
    """Generic request for kind=http. `{session}` and `{seq}` are replaced in path, header values and body."""

    method: str = "POST"
    path: str = "/"
    headers: Mapping[str, str] = field(default_factory=dict)
    body: str | None = None  # text; a dict given to from_params is JSON-encoded first
    stream: bool = False  # True: parse text/event-stream; False: the body is one response

    @classmethod
    def from_params(cls, p: Mapping[str, Any] | None) -> HttpTemplate:
        p = dict(p or {})
        body = p.get("body")
        if body is not None and not isinstance(body, str):
            body = json.dumps(body, separators=(",", ":"))
        unknown = set(p) - {"method", "path", "headers", "body", "stream"}
        if unknown:
            raise ValueError(f"http request template: unknown keys {sorted(unknown)}")
        return cls(
            method=str(p.get("method", "POST")).upper(),
            path=str(p.get("path", "/")),
            headers=dict(p.get("headers") or {}),
            body=body,
            stream=bool(p.get("stream", False)),
        )


@dataclass(frozen=True)
class OpenAIBody:
    """Chat-completions parameters for kind=openai."""

    prompt: str = "Say hello."
    max_tokens: int | None = 16
    extra: Mapping[str, Any] = field(default_factory=dict)  # merged into the JSON body (e.g. temperature)


@dataclass(frozen=True)
class PreparedRequest:
    method: str
    url: str
    headers: dict[str, str]
    body: bytes | None
    stream: bool  # parse the response as SSE
    openai: bool  # classify events as OpenAI chat.completion.chunk


_CACHE_MAX = 4096


class RequestBuilder:
    """Builds the request for (session, seq). The static parts are encoded once, at construction."""

    def __init__(
        self,
        target: Target,
        *,
        openai_body: OpenAIBody | None = None,
        http: HttpTemplate | None = None,
        credential_headers: Mapping[str, str] | None = None,
    ):
        self.target = target
        self._cred = dict(credential_headers or {})
        # openai kind: the request depends only on the session, so it is built once per session (bounded:
        # with sessions=per_request every session is new, and the cache stops growing at _CACHE_MAX).
        self._by_session: dict[str, PreparedRequest] = {}
        base = target.url.rstrip("/")
        if target.kind == TargetKind.openai:
            ob = openai_body or OpenAIBody()
            doc: dict[str, Any] = {
                "model": target.model,
                "stream": True,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": ob.prompt}],
            }
            if ob.max_tokens is not None:
                doc["max_tokens"] = ob.max_tokens
            doc.update(ob.extra)
            self._openai_body = json.dumps(doc, separators=(",", ":")).encode()
            self._url = base + target.path
            self._http: HttpTemplate | None = None
        else:
            self._http = http or HttpTemplate(path=target.path)
            self._url = base + self._http.path
            self._openai_body = b""

    def build(self, session: str, seq: int) -> PreparedRequest:
        t = self.target
        if self._http is None:
            req = self._by_session.get(session)
            if req is not None:
                return req
            headers = {
                **t.headers,
                "Content-Type": "application/json",
                t.session_header: session,
                **self._cred,
            }
            req = PreparedRequest("POST", self._url, headers, self._openai_body, True, True)
            if len(self._by_session) < _CACHE_MAX:
                self._by_session[session] = req
            return req
        h = self._http
        url = self._url
        if "{" in url:
            url = fill(url, session, seq)
        headers = {**t.headers, **{k: fill(v, session, seq) for k, v in h.headers.items()}}
        if t.session_header:
            headers.setdefault(t.session_header, session)
        headers.update(self._cred)
        body = fill(h.body, session, seq).encode() if h.body is not None else None
        return PreparedRequest(h.method, url, headers, body, h.stream, False)


def fill(text: str, session: str, seq: int) -> str:
    """Replace the two placeholders; other braces (JSON) are left alone, unlike str.format."""
    return text.replace("{session}", session).replace("{seq}", str(seq))


def resolve_credentials(target: Target, resolver: CredentialResolver | None) -> dict[str, str]:
    if not target.credential_ref:
        return {}
    if resolver is None:
        raise ValueError(
            f"target.credential_ref={target.credential_ref!r} but no credential resolver was given"
        )
    return dict(resolver(target.credential_ref))
