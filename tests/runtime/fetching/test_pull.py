"""`pull` against a real HTTP server on 127.0.0.1 (tests/helpers/http_server.py): caching, verification,
and every failure the issue lists. Nothing here leaves the machine: index URLs name a host that
is never contacted (`*.invalid`), and every fetch goes through the mirror, i.e. the local server.

Timeouts are short (DUOCAL_HTTP_TIMEOUT=0.3 s, 2 retries, 10 ms backoff) so the whole file runs
in seconds; the stalled-server test proves the bound.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest
from typer.testing import CliRunner

import duocal_runtime as dr
from duocal.cli import app
from duocal_runtime.fetching.download import ChecksumError, DownloadError, DownloadSettings
from duocal_runtime.fetching.prebuilt_index import load_index
from duocal_runtime.fetching.pull import pull
from duocal_runtime.profile.upstream import KNOWN_MODELS

from helpers.http_server import LocalServer, Reply
from helpers.paths import REPO
from helpers.profiles import random_profile, write_pattern

runner = CliRunner()
COMMIT = "1" * 40
ORIGIN = "https://profiles.example.invalid"
RETRIES = 2


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _files(root: Path) -> dict[str, bytes]:
    """Every file under `root` with its bytes (an absent folder has none)."""
    return (
        {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
        if root.exists()
        else {}
    )


@dataclass
class Site:
    """A local server publishing two profiles, and an index (DUOCAL_INDEX) that pins them."""

    server: LocalServer
    cache: Path
    tiny: dr.Profile
    tiny_bytes: bytes
    tiny_path: str
    gates: np.ndarray
    pattern_paths: dict[str, str]
    pattern_bytes: dict[str, bytes]

    def hits(self, path: str) -> int:
        return self.server.hits[path]


def _publish(server: LocalServer, tmp_path: Path) -> tuple[list[dict], dict]:
    tiny = random_profile(layers=3, kv_heads=2, seed=1)
    tiny_bytes = dr.save_profile(tiny, tmp_path / "src" / "tiny.json").read_bytes()
    tiny_path = f"/org/profiles/{COMMIT}/tiny/profile.json"
    server.route(tiny_path, Reply(tiny_bytes))
    gates = np.random.default_rng(0).uniform(-1e-4, 1.0001, (32, 8))
    folder = write_pattern(tmp_path / "src" / "pattern", gates)
    pattern_paths, pattern_bytes = {}, {}
    for name in ("full_attention_heads.tsv", "config.json"):
        pattern_paths[name] = f"/org/profiles/{COMMIT}/pattern/{name}"
        pattern_bytes[name] = (folder / name).read_bytes()
        server.route(pattern_paths[name], Reply(pattern_bytes[name]))

    def file(name, path, data):
        return {"name": name, "url": ORIGIN + path, "sha256": _sha(data), "size": len(data)}

    entries = [
        {
            "name": "test/tiny",
            "model": "test/model",
            "format": "duocal",
            "shape": tiny.shape.to_dict(),
            "files": [file("profile.json", tiny_path, tiny_bytes)],
        },
        {
            "name": "test/pattern",
            "model": "mistralai/Mistral-7B-Instruct-v0.2",
            "format": "upstream-duo-attention",
            "revision": COMMIT,
            "shape": KNOWN_MODELS["Mistral-7B-Instruct-v0.2"][2].to_dict(),
            "files": [file(n, pattern_paths[n], pattern_bytes[n]) for n in pattern_paths],
        },
    ]
    return entries, dict(
        tiny=tiny,
        tiny_bytes=tiny_bytes,
        tiny_path=tiny_path,
        gates=gates,
        pattern_paths=pattern_paths,
        pattern_bytes=pattern_bytes,
    )


@pytest.fixture
def quiet_env(tmp_path, monkeypatch):
    """Short timeouts, a private cache, and no outside settings leaking in."""
    for var in ("DUOCAL_MIRROR", "HF_HUB_OFFLINE", "DUOCAL_INDEX", "DUOCAL_HTTP_DEADLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DUOCAL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DUOCAL_HTTP_TIMEOUT", "0.3")
    monkeypatch.setenv("DUOCAL_HTTP_RETRIES", str(RETRIES))
    monkeypatch.setenv("DUOCAL_HTTP_BACKOFF", "0.01")
    return tmp_path / "cache"


@pytest.fixture
def site(tmp_path, monkeypatch, quiet_env):
    with LocalServer(stall_s=5) as server:
        entries, published = _publish(server, tmp_path)
        index = tmp_path / "index.json"
        index.write_text(json.dumps({"format": "duocal.index", "version": 1, "profiles": entries}))
        monkeypatch.setenv("DUOCAL_INDEX", str(index))
        monkeypatch.setenv("DUOCAL_MIRROR", server.base_url)
        yield Site(server, quiet_env, **published)


def _pattern_folder(site: Site) -> Path:
    return next((site.cache / "profiles" / "index").glob("test--pattern-*"))


# --- the happy path --------------------------------------------------------------------------


def test_pull_prints_the_cached_path_last_and_then_serves_from_the_cache(site):
    result = runner.invoke(app, ["profiles", "pull", "test/tiny"])
    assert result.exit_code == 0, result.output
    path = Path(result.stdout.strip().splitlines()[-1])
    assert path.is_relative_to(site.cache) and path.read_bytes() == site.tiny_bytes  # kept byte for byte
    assert site.hits(site.tiny_path) == 1
    again = runner.invoke(app, ["profiles", "pull", "test/tiny"])
    assert again.stdout.strip().splitlines()[-1] == str(path) and "(cache)" in again.stdout
    assert dr.load_profile("test/tiny").scores == site.tiny.scores  # the loader resolves names the same way
    assert site.hits(site.tiny_path) == 1


def test_an_upstream_pattern_is_converted_and_its_raw_files_kept_and_verified(site):
    pulled = pull("test/pattern")
    assert pulled.origin == "download"
    np.testing.assert_array_equal(np.array(pulled.profile.scores), np.clip(site.gates, 0, 1))
    assert pulled.profile.source["commit"] == COMMIT and pulled.profile.source["pulled_from"] == "test/pattern"
    folder = _pattern_folder(site)
    for name, data in site.pattern_bytes.items():
        assert (folder / "raw" / name).read_bytes() == data
        assert pulled.profile.source["files_sha256"][name] == _sha(data)
    origin = json.loads((folder / "origin.json").read_text())
    assert origin["profile_sha256"] == _sha((folder / "profile.json").read_bytes())


def test_mirror_option_rewrites_every_index_url(site, monkeypatch):
    monkeypatch.delenv("DUOCAL_MIRROR")
    result = runner.invoke(app, ["profiles", "pull", "test/pattern", "--mirror", site.server.base_url + "/"])
    assert result.exit_code == 0, result.output
    assert all(site.hits(p) == 1 for p in site.pattern_paths.values())


def test_a_plain_url_pulls_a_profile_or_an_upstream_tsv_with_its_config(site, monkeypatch):
    monkeypatch.delenv("DUOCAL_MIRROR")
    assert pull(site.server.url(site.tiny_path)).profile.scores == site.tiny.scores
    pulled = pull(site.server.url(site.pattern_paths["full_attention_heads.tsv"]))
    assert pulled.profile.shape.num_key_value_heads == 8
    assert site.hits(site.pattern_paths["config.json"]) == 1
    assert pull(site.server.url(site.tiny_path)).origin == "cache"


def test_list_shows_the_index_and_what_is_cached(site):
    pull("test/tiny")
    result = runner.invoke(app, ["profiles", "list", "--json"])
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    assert rows["test/pattern"]["num_layers"] == 32 and rows["test/pattern"]["num_kv_heads"] == 8
    assert rows["test/tiny"]["cached"] and not rows["test/pattern"]["cached"]
    assert rows["test/pattern"]["size"] == sum(map(len, site.pattern_bytes.values()))
    table = runner.invoke(app, ["profiles", "list"])
    assert table.exit_code == 0 and "test/pattern" in table.stdout and "32 x 8" in table.stdout


# --- failures: clear error, bounded time, retries where sensible, cache untouched -------------


def test_checksum_mismatch_names_both_hashes_and_caches_nothing(site):
    wrong = site.tiny_bytes.replace(b"0.", b"0.1", 1)
    site.server.route(site.tiny_path, Reply(wrong))
    with pytest.raises(ChecksumError) as err:
        pull("test/tiny")
    assert err.value.expected == _sha(site.tiny_bytes) and err.value.actual == _sha(wrong)
    assert site.hits(site.tiny_path) == 1  # a whole body with the wrong hash is not retried
    assert _files(site.cache) == {}
    result = runner.invoke(app, ["profiles", "pull", "test/tiny"])
    assert result.exit_code == 1
    assert _sha(site.tiny_bytes) in result.stderr and _sha(wrong) in result.stderr


FAILURES = {
    # name: (replies, error pattern, requests expected)
    "truncated": ([Reply(b"x" * 4000, fault="truncate")], "truncated body: received 2000 of 4000 bytes", 1 + RETRIES),
    "reset": ([Reply(fault="reset")], "connection reset|closed the connection", 1 + RETRIES),
    "http-500": ([Reply(b"oops", status=500)], "HTTP 500", 1 + RETRIES),
    "http-404": ([Reply(b"no", status=404)], "HTTP 404.*mirror must serve BASE_URL", 1),
    "stall": ([Reply(fault="stall")], r"timed out: the server sent nothing for 0.3 s", 1 + RETRIES),
    "stall-mid-body": ([Reply(b"x" * 4000, fault="stall_body")], r"timed out", 1 + RETRIES),
}


@pytest.mark.parametrize("failure", FAILURES)
def test_a_failing_server_gives_a_clear_error_in_bounded_time_and_leaves_the_cache_alone(site, failure):
    replies, pattern, requests = FAILURES[failure]
    pull("test/pattern")
    before = _files(site.cache)
    site.server.route(site.tiny_path, *replies)
    start = time.monotonic()
    with pytest.raises(DownloadError, match=pattern) as err:
        pull("test/tiny")
    assert time.monotonic() - start < 5.0
    assert site.tiny_path in str(err.value)
    if failure != "http-404":  # transient failures end with what the user can do about them
        assert "--offline" in str(err.value) and f"({1 + RETRIES} attempts)" in str(err.value)
    assert site.hits(site.tiny_path) == requests
    assert _files(site.cache) == before


def test_transient_failures_are_retried_until_the_file_arrives(site):
    site.server.route(site.tiny_path, Reply(status=503), Reply(fault="reset"), Reply(site.tiny_bytes))
    assert pull("test/tiny").profile.scores == site.tiny.scores
    assert site.hits(site.tiny_path) == 3


def test_an_unwritable_cache_is_reported(site, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("DUOCAL_CACHE_DIR", str(blocker))
    with pytest.raises(dr.ProfileError, match=r"cannot write the profile cache.*DUOCAL_CACHE_DIR"):
        pull("test/tiny")


def test_bad_timeout_settings_are_reported(monkeypatch):
    monkeypatch.setenv("DUOCAL_HTTP_TIMEOUT", "soon")
    with pytest.raises(dr.ProfileError, match="DUOCAL_HTTP_TIMEOUT must be a number"):
        DownloadSettings.from_env()


# --- concurrency and corruption --------------------------------------------------------------


def test_two_pulls_at_once_leave_one_valid_file(site):
    site.server.hold_until(2)  # each request waits for the other: the downloads really overlap
    results, errors = [], []

    def worker():
        try:
            results.append(pull("test/pattern"))
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors and len(results) == 2
    assert all(site.hits(p) == 2 for p in site.pattern_paths.values())
    assert results[0].path == results[1].path
    folder = _pattern_folder(site)
    assert sorted(_files(folder)) == ["origin.json", "profile.json", "raw/config.json", "raw/full_attention_heads.tsv"]
    assert dr.load_profile(results[0].path).scores == results[0].profile.scores
    assert pull("test/pattern").origin == "cache"


@pytest.mark.parametrize("damaged", ["profile.json", "raw/full_attention_heads.tsv", "raw/config.json"])
def test_a_corrupted_cached_file_is_detected_and_fetched_again(site, damaged):
    first = pull("test/pattern")
    good = _files(_pattern_folder(site))
    target = _pattern_folder(site) / damaged
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    with pytest.raises(dr.ProfileError, match=r"unusable.*does not match its sha256.*offline"):
        pull("test/pattern", offline=True)
    again = pull("test/pattern")
    assert again.origin == "download" and damaged in again.note
    assert all(site.hits(p) == 2 for p in site.pattern_paths.values())
    assert _files(_pattern_folder(site)) == good and again.profile.scores == first.profile.scores


# --- offline and force -----------------------------------------------------------------------


def test_offline_uses_only_the_cache_and_says_how_to_fill_it(site, monkeypatch):
    with pytest.raises(dr.ProfileError, match=r"not in the cache.*offline mode is on.*duocal profiles pull test/tiny"):
        pull("test/tiny", offline=True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = runner.invoke(app, ["profiles", "pull", "test/tiny"])
    assert result.exit_code == 1 and "HF_HUB_OFFLINE=1" in result.stderr
    assert site.hits(site.tiny_path) == 0
    assert runner.invoke(app, ["profiles", "pull", "test/tiny", "--online"]).exit_code == 0
    assert pull("test/tiny").origin == "cache" and dr.load_profile("test/tiny").scores == site.tiny.scores
    assert site.hits(site.tiny_path) == 1


def test_force_downloads_again_and_refuses_offline(site):
    pull("test/tiny")
    assert pull("test/tiny", force=True).origin == "download"
    assert site.hits(site.tiny_path) == 2
    with pytest.raises(dr.ProfileError, match=r"--force .* offline"):
        pull("test/tiny", force=True, offline=True)


def test_an_unknown_name_fails_with_suggestions(site):
    result = runner.invoke(app, ["profiles", "pull", "test/tin"])
    assert result.exit_code == 1 and "Did you mean test/tiny" in result.stderr


# --- the six real upstream patterns, through the real index ----------------------------------


def test_all_six_upstream_patterns_load_offline_from_their_shipped_copies(upstream_patterns, quiet_env, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    index = load_index()  # the shipped one: DUOCAL_INDEX is unset
    for model in KNOWN_MODELS:
        entry = index.get(f"duo-attention/{model}")
        assert entry.shipped and all(f.url for f in entry.files)  # shipped, and where from
        result = runner.invoke(app, ["profiles", "pull", f"duo-attention/{model}"])
        assert result.exit_code == 0, result.output
        profile = dr.load_profile(Path(result.stdout.strip().splitlines()[-1]))
        assert profile.shape == entry.shape and profile.source["commit"] == entry.revision
        assert profile.scores == dr.import_upstream(upstream_patterns / model).scores


def test_all_six_upstream_patterns_pull_through_an_index_via_mirror(
    upstream_patterns, quiet_env, monkeypatch, tmp_path
):
    """The shipped index without its shipped copies: each file comes from its pinned URL, through the mirror."""
    data = json.loads((REPO / "profiles" / "index.json").read_text())
    upstream = [e for e in data["profiles"] if e["format"] == "upstream-duo-attention"]
    for entry in upstream:
        for f in entry["files"]:
            del f["file"]
    index = tmp_path / "index.json"
    index.write_text(json.dumps({**data, "profiles": upstream}))
    monkeypatch.setenv("DUOCAL_INDEX", str(index))
    with LocalServer() as server:
        for entry in upstream:
            model = entry["name"].split("/", 1)[1]
            for f in entry["files"]:  # laid out under the upstream URL paths
                server.route(urlsplit(f["url"]).path, Reply((upstream_patterns / model / f["name"]).read_bytes()))
        pulled = {}
        for model in KNOWN_MODELS:
            result = runner.invoke(app, ["profiles", "pull", f"duo-attention/{model}", "--mirror", server.base_url])
            assert result.exit_code == 0, result.output
            pulled[model] = Path(result.stdout.strip().splitlines()[-1])
        assert sum(server.hits.values()) == 2 * len(KNOWN_MODELS)
    for model, path in pulled.items():
        assert dr.load_profile(path).scores == dr.import_upstream(upstream_patterns / model).scores


def test_a_server_that_trickles_bytes_meets_the_deadline(site, monkeypatch):
    """A byte every 50 ms never trips the 0.3 s read timeout; the deadline of an attempt still holds."""
    monkeypatch.setenv("DUOCAL_HTTP_DEADLINE", "0.5")
    site.server.route(site.tiny_path, Reply(b"x" * 100_000, fault="trickle"))
    start = time.monotonic()
    with pytest.raises(DownloadError, match=r"took longer than 0.5 s \(DUOCAL_HTTP_DEADLINE\)"):
        pull("test/tiny")
    assert time.monotonic() - start < (1 + RETRIES) * (0.5 + 0.3) + 1.0


@pytest.mark.parametrize("url", ["http://a..b/p.json", "https://" + "a" * 70 + ".org/p.json", "http:///p.json"])
def test_a_url_whose_host_cannot_be_a_host_name_is_a_clear_error(quiet_env, url):
    with pytest.raises(DownloadError, match=r"not a valid host name|has no host"):
        pull(url)
