"""Fetch one file over HTTP(S) with bounded time, retries for transient failures, and verification.

Profiles and upstream patterns are small (kilobytes), so a file is read into memory, checked
against its expected size and sha256, and only then handed to the cache, which writes it
atomically. A failed or unverified download therefore never leaves anything on disk.

What is retried (with exponential backoff): connection refused or reset, a server that sends
nothing for `timeout` seconds, a body shorter than its Content-Length, HTTP 408/429/5xx.
What is not: other 4xx (the file is not there, retrying will not put it there), a complete body
with the wrong sha256 (the server serves a different file), a body over `max_bytes`.

Mirrors: with `mirror=BASE_URL` (or `DUOCAL_MIRROR`), an index URL `https://host/a/b/file` is
fetched from `BASE_URL/a/b/file`, so a mirror is a plain static copy of the original paths
(`pull` applies it to index URLs; a URL the user types is fetched as given).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import ProfileError

MIRROR_ENV = "DUOCAL_MIRROR"
RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
SCHEMES = ("http", "https", "file")
_CHUNK = 1 << 16
_ADVICE = (
    "check your network or proxy, point --mirror / DUOCAL_MIRROR at a reachable copy, "
    "or use --offline for a profile that is already in the cache"
)


class DownloadError(ProfileError):
    """A file could not be downloaded (network, HTTP status, size). Nothing was written."""


class ChecksumError(DownloadError):
    """A downloaded file does not have the sha256 the index pins for it."""

    def __init__(self, url: str, expected: str, actual: str, sizes: str = ""):
        self.url, self.expected, self.actual = url, expected, actual
        super().__init__(
            f"checksum mismatch for {url}: expected sha256 {expected}, got {actual}{sizes}; "
            "the file changed upstream or the mirror serves a different file. Nothing was cached."
        )


class _Transient(Exception):
    """A failure worth retrying; the message says what happened."""


def _env_float(name: str, default: float, minimum: float) -> float:
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= minimum:
        raise ProfileError(f"{name} must be a number >= {minimum}, got {text!r}")
    return value


@dataclass(frozen=True)
class DownloadSettings:
    """How long to wait and how often to retry. Seconds throughout.

    `timeout` bounds each connect and each read (a stalled server), `deadline` one whole
    attempt (a server that trickles bytes), `retries` counts attempts after the first, and the
    n-th retry waits `backoff * 2**(n-1)`.
    """

    timeout: float = 30.0
    deadline: float = 300.0
    retries: int = 3
    backoff: float = 1.0
    max_bytes: int = 64 << 20

    def __post_init__(self):
        if not (self.timeout > 0 and self.deadline > 0 and self.backoff >= 0 and self.max_bytes > 0):
            raise ProfileError(f"download settings must be positive, got {self}")
        if not isinstance(self.retries, int) or self.retries < 0:
            raise ProfileError(f"retries must be an integer >= 0, got {self.retries!r}")

    @classmethod
    def from_env(cls) -> DownloadSettings:
        """Defaults, overridden by DUOCAL_HTTP_TIMEOUT / _DEADLINE / _RETRIES / _BACKOFF."""
        return cls(
            timeout=_env_float("DUOCAL_HTTP_TIMEOUT", cls.timeout, 0.001),
            deadline=_env_float("DUOCAL_HTTP_DEADLINE", cls.deadline, 0.001),
            retries=int(_env_float("DUOCAL_HTTP_RETRIES", cls.retries, 0)),
            backoff=_env_float("DUOCAL_HTTP_BACKOFF", cls.backoff, 0),
        )


def mirror_url(url: str, mirror: str | None) -> str:
    """`url` fetched through `mirror`: BASE_URL + the URL's path (query and host dropped)."""
    if not mirror:
        return url
    return mirror.rstrip("/") + urlsplit(url).path


def env_mirror() -> str | None:
    return os.environ.get(MIRROR_ENV) or None


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def verify(data: bytes, url: str, sha256: str | None = None, size: int | None = None) -> None:
    """Raise unless `data` has the expected sha256 and size (either may be None: not checked)."""
    if sha256 is not None:
        actual = sha256_hex(data)
        if actual != sha256.lower():
            sizes = f" ({len(data)} bytes, expected {size})" if size is not None and size != len(data) else ""
            raise ChecksumError(url, sha256.lower(), actual, sizes)
    if size is not None and len(data) != size:
        raise DownloadError(
            f"{url}: expected {size} bytes, got {len(data)}; the file changed upstream or the mirror "
            "serves a different file. Nothing was cached."
        )


def fetch(
    url: str, *, sha256: str | None = None, size: int | None = None, settings: DownloadSettings | None = None
) -> bytes:
    """The verified bytes at `url`, or `DownloadError` after bounded time and retries."""
    settings = settings or DownloadSettings.from_env()
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise DownloadError(f"cannot download {url!r}: only {', '.join(SCHEMES)} URLs are supported")
    if parts.scheme != "file" and not parts.hostname:
        raise DownloadError(f"cannot download {url!r}: the URL has no host; give http(s)://HOST/PATH")
    if parts.scheme != "file":
        try:
            parts.hostname.encode("idna")
        except UnicodeError:
            raise DownloadError(f"cannot download {url!r}: {parts.hostname!r} is not a valid host name") from None
    reasons: list[str] = []
    for attempt in range(settings.retries + 1):
        if attempt:
            time.sleep(settings.backoff * 2 ** (attempt - 1))
        try:
            data = _fetch_once(url, settings.max_bytes, settings)
        except _Transient as err:
            reasons.append(str(err))
            continue
        verify(data, url, sha256, size)
        return data
    tries = f"{len(reasons)} attempt{'s' if len(reasons) > 1 else ''}"
    raise DownloadError(f"could not download {url}: {reasons[-1]} ({tries}); {_ADVICE}")


def _check_local(url: str) -> None:
    """A file:// URL must name a regular file: a fifo or a device would block or never end."""
    path = Path(urllib.request.url2pathname(urlsplit(url).path))
    if path.exists() and not path.is_file():
        kind = "a folder" if path.is_dir() else "not a regular file (a fifo, socket or device)"
        raise DownloadError(f"cannot read {url}: {path} is {kind}; give the URL of a profile file")


def _fetch_once(url: str, limit: int, settings: DownloadSettings) -> bytes:
    if urlsplit(url).scheme == "file":
        _check_local(url)
    request = urllib.request.Request(url, headers={"User-Agent": "duocal-runtime", "Accept-Encoding": "identity"})
    try:
        with urllib.request.urlopen(request, timeout=settings.timeout) as response:
            declared = response.headers.get("Content-Length")
            data = _read_body(response, url, limit, time.monotonic() + settings.deadline, settings.deadline)
    except urllib.error.HTTPError as err:
        err.close()
        raise _status_error(url, err.code, str(err.reason)) from None
    except urllib.error.URLError as err:
        if isinstance(err.reason, FileNotFoundError):  # a file:// mirror without that file
            raise DownloadError(f"could not download {url}: no such file; check the mirror's layout") from None
        raise _Transient(_describe(err.reason, settings)) from None
    except (OSError, http.client.HTTPException) as err:
        raise _Transient(_describe(err, settings)) from None
    if declared is not None and declared.isdigit() and len(data) < int(declared):
        raise _Transient(f"truncated body: received {len(data)} of {declared} bytes")
    return data


def _read_body(response, url: str, limit: int, deadline: float, seconds: float) -> bytes:
    """The body, read as it arrives (`read1`: one receive at a time, so a server that trickles bytes meets
    the deadline after at most one more `timeout`, not after a whole chunk's worth of bytes)."""
    read = getattr(response, "read1", response.read)
    chunks, total = [], 0
    while chunk := read(_CHUNK):
        total += len(chunk)
        if total > limit:
            raise DownloadError(f"{url} sent more than {limit} bytes: it is not a profile. Nothing was cached.")
        if time.monotonic() > deadline:
            raise _Transient(f"the download took longer than {seconds:g} s (DUOCAL_HTTP_DEADLINE)")
        chunks.append(chunk)
    return b"".join(chunks)


def _status_error(url: str, code: int, reason: str) -> Exception:
    if code in RETRY_STATUS:
        return _Transient(f"HTTP {code} {reason}")
    hint = (
        "the file is not at that address: check the name (duocal profiles list) or the URL; "
        "a mirror must serve BASE_URL + the original URL's path"
        if code in (404, 410)
        else "the server refused the request"
    )
    return DownloadError(f"could not download {url}: HTTP {code} {reason}; {hint}")


def _describe(reason: object, settings: DownloadSettings) -> str:
    if isinstance(reason, TimeoutError):
        return f"timed out: the server sent nothing for {settings.timeout:g} s (DUOCAL_HTTP_TIMEOUT)"
    if isinstance(reason, ConnectionResetError):
        return "connection reset by the server"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, http.client.IncompleteRead):
        return f"truncated body: received {len(reason.partial)} bytes, then the connection closed"
    if isinstance(reason, http.client.RemoteDisconnected):
        return "the server closed the connection without answering"
    return f"{type(reason).__name__}: {reason}"
