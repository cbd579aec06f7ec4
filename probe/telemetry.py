"""Per-attempt telemetry: NDJSON chunks plus a manifest with each chunk's sha256.

Records are buffered per stream and uploaded as `jobs/<job>/telemetry/<NNNN>/<stream>-<seq>.ndjson` when a
chunk is full and on close; `manifest.json` lists every chunk so a reader can verify it got them all.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

from csbench.probe.blobstore import BlobStore, StoreError
from csbench.probe.protocol import Keys, TelemetryChunk, TelemetryManifest

_NAME_OK = set("abcdefghijklmnopqrstuvwxyz0123456789_-")


def encode_chunk(records: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r, separators=(",", ":"), default=str).encode() + b"\n" for r in records)


class TelemetryWriter:
    def __init__(self, store: BlobStore, keys: Keys, job_id: str, attempt: int, *,
                 chunk_records: int = 5000, upload_retries: int = 3):
        self.store = store
        self.dir = keys.telemetry_dir(job_id, attempt)
        self.job_id = job_id
        self.attempt = attempt
        self.chunk_records = chunk_records
        self.upload_retries = upload_retries
        self._buf: dict[str, list[dict[str, Any]]] = {}
        self._seq: dict[str, int] = {}
        self.chunks: list[TelemetryChunk] = []
        self.lost_records = 0  # records whose chunk could not be uploaded after retries

    async def write(self, stream: str, record: dict[str, Any]) -> None:
        if not stream or not set(stream) <= _NAME_OK:
            raise ValueError(f"telemetry stream name {stream!r}: use lowercase letters, digits, '_' and '-'")
        buf = self._buf.setdefault(stream, [])
        buf.append(record)
        if len(buf) >= self.chunk_records:
            await self._flush(stream)

    async def _flush(self, stream: str) -> None:
        records = self._buf.pop(stream, [])
        if not records:
            return
        seq = self._seq.get(stream, 0)
        self._seq[stream] = seq + 1
        body = encode_chunk(records)
        key = f"{self.dir}{stream}-{seq:05d}.ndjson"
        for attempt in range(self.upload_retries + 1):
            try:
                await asyncio.to_thread(self.store.put, key, body, "application/x-ndjson")
                break
            except StoreError:
                if attempt == self.upload_retries:
                    self.lost_records += len(records)
                    return
                await asyncio.sleep(min(2.0 ** attempt, 8.0))
        self.chunks.append(TelemetryChunk(stream=stream, key=key, records=len(records),
                                          sha256=hashlib.sha256(body).hexdigest(), bytes=len(body)))

    async def close(self) -> str | None:
        """Flush every stream and write the manifest; returns its key, or None if nothing was written."""
        for stream in list(self._buf):
            await self._flush(stream)
        if not self.chunks:
            return None
        manifest = TelemetryManifest(job_id=self.job_id, attempt=self.attempt, chunks=self.chunks)
        key = self.dir + "manifest.json"
        for attempt in range(self.upload_retries + 1):
            try:
                await asyncio.to_thread(self.store.put, key, manifest.to_bytes())
                return key
            except StoreError:
                if attempt == self.upload_retries:
                    return None
                await asyncio.sleep(min(2.0 ** attempt, 8.0))
        return None
