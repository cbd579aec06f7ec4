"""Access keys, RAM roles and STS tokens shared by every localcloud service.

One store answers "which secret signs for this AccessKeyId, and is its token still valid?" for OSS and ECS,
and mints the temporary credentials the instance metadata service hands to an instance's RAM role —
so a carrier's STS credentials are verified by OSS exactly as Aliyun would verify them.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Credential:
    access_key_id: str
    access_key_secret: str
    security_token: str | None = None  # only STS credentials have one
    expires_at: float | None = None  # unix seconds; None = long-term key
    role_name: str | None = None

    def expired(self, now: float | None = None) -> bool:
        return self.expires_at is not None and (now or time.time()) >= self.expires_at


class CredentialError(Exception):
    """A credential was refused; `code` is the Aliyun error code the calling service should answer with."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class CredentialStore:
    """Thread-safe; persisted to `path` (JSON) when given, so a localcloud restart keeps its keys."""

    def __init__(self, path: Path | None = None):
        self._path = path
        self._lock = threading.Lock()
        self._keys: dict[str, Credential] = {}
        self._roles: dict[str, float] = {}  # role name -> unix time it was created
        if path is not None and path.exists():
            self._load(path)

    # -- long-term keys and roles -------------------------------------------------------------------
    def add_access_key(self, access_key_id: str | None = None, secret: str | None = None) -> Credential:
        cred = Credential(access_key_id or "LTAI" + secrets.token_hex(10), secret or secrets.token_urlsafe(24))
        with self._lock:
            self._keys[cred.access_key_id] = cred
            self._save()
        return cred

    def create_role(self, name: str, created_at: float | None = None) -> None:
        with self._lock:
            self._roles.setdefault(name, created_at if created_at is not None else time.time())
            self._save()

    def role_created_at(self, name: str) -> float | None:
        with self._lock:
            return self._roles.get(name)

    def roles(self) -> list[str]:
        with self._lock:
            return sorted(self._roles)

    # -- STS ----------------------------------------------------------------------------------------
    def issue_sts(self, role_name: str, ttl_seconds: float = 3600.0) -> Credential:
        if self.role_created_at(role_name) is None:
            raise CredentialError("EntityNotExist.Role", f"The role {role_name!r} does not exist.")
        cred = Credential(
            access_key_id="STS." + secrets.token_hex(12),
            access_key_secret=secrets.token_urlsafe(24),
            security_token="CAIS" + secrets.token_urlsafe(48),
            expires_at=time.time() + ttl_seconds,
            role_name=role_name,
        )
        with self._lock:
            self._keys[cred.access_key_id] = cred
            self._prune_locked()
            self._save()
        return cred

    # -- verification -------------------------------------------------------------------------------
    def lookup(self, access_key_id: str, security_token: str | None = None) -> Credential:
        """The credential for `access_key_id`, checked for existence, token match and expiry.

        Raises CredentialError with Aliyun's codes: InvalidAccessKeyId, InvalidSecurityToken(.Expired/.Mismatch).
        """
        with self._lock:
            cred = self._keys.get(access_key_id)
        if cred is None:
            raise CredentialError("InvalidAccessKeyId", f"The AccessKeyId {access_key_id!r} does not exist.")
        if cred.security_token is not None:
            if not security_token:
                raise CredentialError("InvalidSecurityToken.MissingToken",
                                      "This is an STS AccessKeyId; the security token is missing.")
            if not secrets.compare_digest(security_token, cred.security_token):
                raise CredentialError("InvalidSecurityToken.Mismatch",
                                      "The security token does not match the AccessKeyId.")
            if cred.expired():
                raise CredentialError("InvalidSecurityToken.Expired", "The security token has expired.")
        return cred

    # -- persistence --------------------------------------------------------------------------------
    def _prune_locked(self) -> None:
        # Keep expired STS keys for an hour so callers still get "Expired" rather than "unknown key".
        horizon = time.time() - 3600
        for ak in [k for k, c in self._keys.items() if c.expires_at is not None and c.expires_at < horizon]:
            del self._keys[ak]

    def _save(self) -> None:
        if self._path is None:
            return
        doc = {"keys": [asdict(c) for c in self._keys.values()], "roles": self._roles}
        tmp = self._path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(self._path)

    def _load(self, path: Path) -> None:
        doc = json.loads(path.read_text())
        self._keys = {k["access_key_id"]: Credential(**k) for k in doc.get("keys", [])}
        self._roles = {str(k): float(v) for k, v in doc.get("roles", {}).items()}
