"""``--web-config-file``: TLS and basic auth for kvwatch's ``/metrics``, in Prometheus' own format.

The file is the exporter-toolkit web configuration that node_exporter and every official
exporter read (https://github.com/prometheus/exporter-toolkit/blob/master/docs/web-configuration.md),
so one file and one Prometheus scrape config (``scheme: https``, ``basic_auth``, ``tls_config``)
serve them all::

    tls_server_config:
      cert_file: /etc/kvwatch/tls.crt
      key_file: /etc/kvwatch/tls.key
      # client_ca_file + client_auth_type: RequireAndVerifyClientCert for mutual TLS
    basic_auth_users:
      prometheus: $2y$10$...   # htpasswd -nBC 10 "" | tr -d ':\\n'

What is supported: ``tls_server_config`` (``cert_file``, ``key_file``, ``client_ca_file``,
``client_auth_type`` NoClientCert / VerifyClientCertIfGiven / RequireAndVerifyClientCert,
``min_version``, ``max_version``) and ``basic_auth_users`` with bcrypt hashes, as the toolkit
accepts. Any other key is refused by name rather than ignored (a security setting silently
dropped is worse than a refused start), as the toolkit's strict YAML decoding refuses unknown keys.

bcrypt comes from the system's libcrypt (libxcrypt on Debian, Ubuntu, Fedora, Alpine's
libxcrypt; glibc's own crypt() before 2.38 has no bcrypt), through ctypes: no new Python
dependency for a few hash checks a minute. A successful check is cached for its exact
(user, password, hash), as the toolkit's ``web/cache.go`` does, so a 15 s scrape does not pay a
bcrypt each time; checks are serialised so wrong passwords cannot occupy more than one core.
"""

from __future__ import annotations

import base64
import binascii
import ctypes
import ctypes.util
import functools
import hashlib
import hmac
import ssl
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvwatch.errors import UsageError

_TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version"}
_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
#: exporter-toolkit's client_auth_type values that Python's ssl can honour as Go's crypto/tls does.
#: (RequestClientCert and RequireAnyClientCert accept an unverified certificate, which OpenSSL's
#: server side cannot express without accepting anything; they are refused by name.)
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_BCRYPT_PREFIXES = ("$2a$", "$2b$", "$2y$")
#: A valid bcrypt hash of a random password, checked for unknown users so that the answer takes
#: as long as for a known one (exporter-toolkit does the same).
_DUMMY_HASH = "$2b$10$ZVKH1fOfhDOb7u6dNTOtiudJPOFPanAVYwAHeiEXo3wcI3OJ2jv2."
_CACHE_ENTRIES = 128


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """The ``tls_server_config`` block, checked (files readable, names known)."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None
    client_auth_type: str = "NoClientCert"
    min_version: str = "TLS12"
    max_version: str | None = None

    def context(self) -> ssl.SSLContext:
        """A server-side SSL context; raises UsageError naming the file that would not load."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = _TLS_VERSIONS[self.min_version]
        if self.max_version is not None:
            ctx.maximum_version = _TLS_VERSIONS[self.max_version]
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(
                f"--web-config-file: cannot load cert_file {self.cert_file} / key_file {self.key_file}: "
                f"{getattr(exc, 'strerror', None) or exc}; give a PEM certificate and its key"
            ) from None
        ctx.verify_mode = _CLIENT_AUTH[self.client_auth_type]
        if self.client_ca_file is not None:
            try:
                ctx.load_verify_locations(cafile=str(self.client_ca_file))
            except (OSError, ssl.SSLError) as exc:
                raise UsageError(
                    f"--web-config-file: cannot load client_ca_file {self.client_ca_file}: "
                    f"{getattr(exc, 'strerror', None) or exc}"
                ) from None
        return ctx


@dataclass(frozen=True, slots=True)
class WebConfig:
    """A loaded web-config file: optional TLS, optional basic-auth users (name -> bcrypt hash)."""

    path: Path
    tls: TlsSettings | None = None
    basic_auth_users: dict[str, str] = field(default_factory=dict)


def load_web_config(path: Path) -> WebConfig:
    """Read and check ``path``; every problem is a UsageError naming the key and what to do."""
    import yaml  # the format is YAML (exporter-toolkit); imported only when a file is given

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--web-config-file {path}: {exc.strerror or exc}; give a readable file") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"--web-config-file {path}: not valid YAML{where}; see docs/deploy.md") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise UsageError(f"--web-config-file {path}: expected a mapping with tls_server_config / basic_auth_users")
    unknown = sorted(set(doc) - {"tls_server_config", "basic_auth_users"})
    if unknown:
        raise UsageError(
            f"--web-config-file {path}: {unknown[0]!r} is not supported by kvwatch "
            "(supported: tls_server_config, basic_auth_users)"
        )
    tls = _tls(path, doc.get("tls_server_config"))
    users = _users(path, doc.get("basic_auth_users"))
    if users and not bcrypt_available():
        raise UsageError(
            f"--web-config-file {path}: basic_auth_users needs bcrypt, which this system's libcrypt lacks; "
            "install libxcrypt (libcrypt1) or put kvwatch behind an authenticating proxy"
        )
    for user, hashed in users.items():
        if _crypt(b"probe", hashed.encode()) is None:
            raise UsageError(f"--web-config-file {path}: basic_auth_users.{user} is not a valid bcrypt hash")
    return WebConfig(Path(path), tls, users)


def _tls(path: Path, block: Any) -> TlsSettings | None:
    if block is None:
        return None
    if not isinstance(block, dict):
        raise UsageError(f"--web-config-file {path}: tls_server_config must be a mapping")
    unknown = sorted(set(block) - _TLS_KEYS)
    if unknown:
        raise UsageError(f"--web-config-file {path}: tls_server_config.{unknown[0]} is not supported by kvwatch")
    for key in ("cert_file", "key_file"):
        if not isinstance(block.get(key), str) or not block[key]:
            raise UsageError(f"--web-config-file {path}: tls_server_config.{key} is required")
    auth = block.get("client_auth_type") or "NoClientCert"
    if auth not in _CLIENT_AUTH:
        raise UsageError(
            f"--web-config-file {path}: client_auth_type {auth!r} is not supported "
            f"(use one of {', '.join(_CLIENT_AUTH)})"
        )
    if auth != "NoClientCert" and not block.get("client_ca_file"):
        raise UsageError(f"--web-config-file {path}: client_auth_type {auth} needs client_ca_file")
    versions = {}
    for key in ("min_version", "max_version"):
        value = block.get(key)
        if value is not None and value not in _TLS_VERSIONS:
            raise UsageError(f"--web-config-file {path}: tls_server_config.{key} {value!r} is not one of TLS10..TLS13")
        versions[key] = value
    base = Path(path).parent  # exporter-toolkit resolves relative file names against the config's folder
    settings = TlsSettings(
        cert_file=base / block["cert_file"],
        key_file=base / block["key_file"],
        client_ca_file=base / block["client_ca_file"] if block.get("client_ca_file") else None,
        client_auth_type=auth,
        min_version=versions["min_version"] or "TLS12",
        max_version=versions["max_version"],
    )
    settings.context()  # refuse at start, not at the first scrape
    return settings


def _users(path: Path, block: Any) -> dict[str, str]:
    if block is None:
        return {}
    if not isinstance(block, dict):
        raise UsageError(f"--web-config-file {path}: basic_auth_users must map user names to bcrypt hashes")
    users: dict[str, str] = {}
    for user, hashed in block.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise UsageError(f"--web-config-file {path}: basic_auth_users has an invalid user name")
        if not isinstance(hashed, str) or not hashed.startswith(_BCRYPT_PREFIXES):
            raise UsageError(
                f"--web-config-file {path}: basic_auth_users.{user} must be a bcrypt hash ($2y$...); "
                "make one with: htpasswd -nBC 10 \"\" | tr -d ':\\n'"
            )
        users[user] = hashed
    return users


# ---------------------------------------------------------------------- bcrypt through libcrypt

#: sizeof(struct crypt_data) is 32768 in libxcrypt (crypt.h); twice that leaves room for any build.
_CRYPT_DATA_BYTES = 1 << 16


@functools.lru_cache(maxsize=1)
def _libcrypt() -> Any:
    """libxcrypt's ``crypt_rn`` (thread-safe; NULL rather than "*0" on failure), or None."""
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("crypt") or "libcrypt.so.1").crypt_rn
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_char_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int]
    return fn


def _crypt(password: bytes, setting: bytes) -> bytes | None:
    fn = _libcrypt()
    if not fn or b"\0" in password:
        return None
    data = ctypes.create_string_buffer(_CRYPT_DATA_BYTES)
    out: bytes | None = fn(password, setting, data, _CRYPT_DATA_BYTES)
    return out if out and out.startswith(b"$2") else None


def bcrypt_available() -> bool:
    """Whether the system's libcrypt computes bcrypt (checked on a known hash)."""
    return _crypt(b"kvwatch", _DUMMY_HASH.encode()) is not None


class BasicAuth:
    """Checks ``Authorization: Basic ...`` headers against the users of a web-config file."""

    def __init__(self, users: dict[str, str]) -> None:
        self._users = {u: h.encode() for u, h in users.items()}
        self._ok: OrderedDict[bytes, None] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._bcrypt_lock = threading.Lock()  # one bcrypt at a time: wrong passwords cost one core at most

    def allowed(self, header: str | None) -> bool:
        """True when the header names a configured user with the right password."""
        if not header or header[:6].lower() != "basic ":
            return False
        try:
            decoded = base64.b64decode(header[6:].strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        user_b, sep, password = decoded.partition(b":")
        if not sep:
            return False
        user = user_b.decode("utf-8", errors="replace")
        hashed = self._users.get(user)
        key = hashlib.sha256(user_b + b"\0" + password + b"\0" + (hashed or b"")).digest()
        with self._cache_lock:
            if hashed is not None and key in self._ok:
                self._ok.move_to_end(key)
                return True
        with self._bcrypt_lock:
            result = _crypt(password, hashed or _DUMMY_HASH.encode())
        if hashed is None or result is None or not hmac.compare_digest(result, hashed):
            return False
        with self._cache_lock:
            self._ok[key] = None
            while len(self._ok) > _CACHE_ENTRIES:
                self._ok.popitem(last=False)
        return True
