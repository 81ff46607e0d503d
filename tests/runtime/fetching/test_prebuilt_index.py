"""The prebuilt index (profiles/index.json): valid, pinned, hashes right, shipped profiles load.

Also how references resolve (name, URL, hf://, path) and how mirrors rewrite URLs.
"""

import hashlib
import json
import re
from pathlib import Path

import pytest

import duocal_runtime as dr
from duocal_runtime.fetching.download import mirror_url
from duocal_runtime.fetching.hub import HubRef, parse_hf_ref
from duocal_runtime.fetching.prebuilt_index import (
    IndexEntry,
    PathSource,
    UrlSource,
    default_index_path,
    index_from_dict,
    load_index,
    resolve,
)
from duocal_runtime.fetching.pull import pull
from duocal_runtime.profile.upstream import KNOWN_MODELS, UPSTREAM_COMMIT, UPSTREAM_REPO

from helpers.paths import REPO
from helpers.profiles import random_profile

PROFILES_DIR = REPO / "profiles"
INDEX_JSON = PROFILES_DIR / "index.json"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_shipped_index_is_the_package_data_and_loads():
    assert default_index_path().resolve() == INDEX_JSON.resolve()
    index = load_index()
    assert len(index.entries) >= len(KNOWN_MODELS)


def test_names_are_unique_and_every_url_is_pinned_to_a_commit():
    raw = json.loads(INDEX_JSON.read_text())
    names = [e["name"] for e in raw["profiles"]]
    assert len({n.lower() for n in names}) == len(names)
    for entry in raw["profiles"]:
        for f in entry["files"]:
            assert re.fullmatch(r"[0-9a-f]{64}", f["sha256"]) and f["size"] > 0
            if "url" in f:
                pinned = re.search(r"/[0-9a-f]{40}/", f["url"]) or re.search(r"@[0-9a-f]{40}$", f["url"])
                assert pinned, f"{entry['name']}: {f['url']} is not pinned to a commit"
                assert not re.search(r"/(main|master|HEAD)/", f["url"])


def test_the_six_upstream_patterns_are_listed_at_the_pinned_commit():
    index = load_index()
    for model, (hub_id, _arch, shape) in KNOWN_MODELS.items():
        entry = index.get(f"duo-attention/{model}")
        ctx = "1000_128000" if model == "Meta-Llama-3.1-8B-Instruct" else "1000_32000"
        base = (
            f"https://raw.githubusercontent.com/{UPSTREAM_REPO}/{UPSTREAM_COMMIT}/attn_patterns/{model}/"
            f"lr=0.02-reg=0.05-ctx={ctx}-multi_passkey10"
        )
        assert (entry.model, entry.format, entry.shape, entry.revision) == (
            hub_id,
            "upstream-duo-attention",
            shape,
            UPSTREAM_COMMIT,
        )
        assert {f.name: f.url for f in entry.files} == {
            "full_attention_heads.tsv": f"{base}/full_attention_heads.tsv",
            "config.json": f"{base}/config.json",
        }


def test_upstream_hashes_sizes_and_shapes_match_the_real_files(upstream_patterns):
    sums = dict(reversed(line.split()) for line in (upstream_patterns / "SHA256SUMS").read_text().splitlines())
    index = load_index()
    for model in KNOWN_MODELS:
        entry = index.get(f"duo-attention/{model}")
        for f in entry.files:
            local = upstream_patterns / model / f.name
            assert f.sha256 == _sha(local) == sums[f"{model}/{f.name}"]
            assert f.size == local.stat().st_size
        assert dr.import_upstream(upstream_patterns / model).shape == entry.shape


def test_every_shipped_profile_loads_offline_and_matches_its_hash_and_shape(tmp_path):
    for entry in load_index().entries:
        if not entry.shipped:
            continue
        for f in entry.files:
            assert _sha(f.local) == f.sha256, f"{f.local} does not match its sha256 in index.json"
            assert f.local.is_relative_to(PROFILES_DIR)
        pulled = pull(entry.name, offline=True, cache_dir=tmp_path)
        assert pulled.profile.shape == entry.shape
        assert pulled.profile.model.name_or_path == entry.model


def test_every_file_in_the_profiles_folder_is_in_the_index():
    """Every duocal profile (and every upstream pattern's file) the folder ships is named by an entry."""
    listed = {f.local.resolve() for e in load_index().entries for f in e.files if f.local is not None}
    upstream = PROFILES_DIR / "duo-attention"
    for path in sorted(upstream.glob("*/*")):
        assert path.resolve() in listed, f"{path} ships without an index entry"
    for path in sorted(PROFILES_DIR.glob("*.json")):
        if path.name == "index.json":
            continue
        profile = dr.load_profile(path)
        suggestion = json.dumps(
            {
                "name": path.stem,
                "model": profile.model.name_or_path,
                "format": "duocal",
                "shape": profile.shape.to_dict(),
                "files": [
                    {
                        "name": "profile.json",
                        "file": str(path.relative_to(PROFILES_DIR)),
                        "sha256": _sha(path),
                        "size": path.stat().st_size,
                    }
                ],
            }
        )
        assert path.resolve() in listed, f"{path} ships without an index entry; add: {suggestion}"


# --- a shipped entry, end to end, in an index the test writes -------------------------------


def _shipped_index(tmp_path, profile, shape=None) -> Path:
    folder = tmp_path / "profiles"
    path = dr.save_profile(profile, folder / "demo" / "demo.json")
    entry = {
        "name": "demo/tiny",
        "model": profile.model.name_or_path,
        "format": "duocal",
        "shape": (shape or profile.shape).to_dict(),
        "files": [
            {"name": "profile.json", "file": "demo/demo.json", "sha256": _sha(path), "size": path.stat().st_size}
        ],
    }
    index = folder / "index.json"
    index.write_text(json.dumps({"format": "duocal.index", "version": 1, "profiles": [entry]}))
    return index


def test_a_shipped_entry_loads_without_network_or_cache(tmp_path, monkeypatch):
    profile = random_profile(layers=3, kv_heads=2)
    index_path = _shipped_index(tmp_path, profile)
    pulled = pull("demo/tiny", offline=True, cache_dir=tmp_path / "cache", index=load_index(index_path))
    assert pulled.origin == "shipped" and pulled.path == tmp_path / "profiles" / "demo" / "demo.json"
    assert pulled.profile.scores == profile.scores
    assert not (tmp_path / "cache").exists()
    monkeypatch.setenv("DUOCAL_INDEX", str(index_path))
    monkeypatch.setenv("DUOCAL_CACHE_DIR", str(tmp_path / "cache"))
    assert dr.load_profile("demo/tiny").scores == profile.scores
    assert dr.load_profile("DEMO/Tiny").scores == profile.scores  # names match ignoring case


def test_a_damaged_shipped_profile_is_refused(tmp_path):
    index_path = _shipped_index(tmp_path, random_profile())
    shipped = tmp_path / "profiles" / "demo" / "demo.json"
    shipped.write_text(shipped.read_text().replace("0.", "0.9", 1))
    with pytest.raises(dr.ProfileError, match=r"damaged or missing.*expected sha256.*reinstall"):
        pull("demo/tiny", cache_dir=tmp_path / "cache", index=load_index(index_path))


def test_an_entry_whose_shape_differs_from_its_profile_is_refused(tmp_path):
    profile = random_profile(layers=3, kv_heads=2)
    wrong = dr.ModelShape(4, 4, 2, 8)
    index_path = _shipped_index(tmp_path, profile, shape=wrong)
    with pytest.raises(dr.ProfileError, match=r"index says 4 layers x 2 KV heads.*holds 3 layers x 2 KV heads"):
        pull("demo/tiny", cache_dir=tmp_path / "cache", index=load_index(index_path))


# --- validation of index files ---------------------------------------------------------------


def _entry(**changes):
    f = {"name": "profile.json", "url": f"https://example.org/{'a' * 40}/p.json", "sha256": "0" * 64, "size": 10}
    entry = {
        "name": "x",
        "model": "o/m",
        "format": "duocal",
        "shape": {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8},
        "files": [f],
    }
    for key, value in changes.items():
        if key.startswith("file_"):
            f[key[5:]] = value
        else:
            entry[key] = value
    return entry


@pytest.mark.parametrize(
    "entries, message",
    [
        ([_entry(), _entry(name="X")], "duplicate profile name"),
        ([_entry(file_url="https://raw.githubusercontent.com/o/r/main/p.json")], "pinned"),
        ([_entry(file_url="hf://o/r/profile.json@main")], "40-hex commit"),
        ([_entry(file_url="http://example.org/x.json")], "pinned"),
        ([_entry(file_sha256="abc")], "64 hex digits"),
        ([_entry(format="gguf")], "format must be one of"),
        ([_entry(file_name="weights.bin")], "has files"),
        ([_entry(file_file="../outside.json")], "'file' must be a path inside the profiles folder"),
        ([_entry(file_url=None)], "give 'url' \\(downloaded\\), 'file' \\(shipped\\) or both"),
        ([_entry(name="https://evil")], "no URL scheme"),
        ([_entry(shape={"num_hidden_layers": 2})], "shape needs exactly"),
        ([_entry(model="")], "'model' must be a non-empty"),
        ([_entry(revision="b" * 40)], "not at the entry's revision"),
    ],
)
def test_bad_index_entries_are_refused_with_a_reason(entries, message):
    with pytest.raises(dr.ProfileError, match=message):
        index_from_dict({"format": "duocal.index", "version": 1, "profiles": entries}, Path("."))


def test_a_shipped_file_must_stay_inside_the_profiles_folder():
    entry = _entry()
    entry["files"][0].pop("url")
    entry["files"][0]["file"] = "../../etc/passwd"
    with pytest.raises(dr.ProfileError, match="inside the profiles folder"):
        index_from_dict({"format": "duocal.index", "version": 1, "profiles": [entry]}, Path("."))


def test_an_index_of_another_format_is_refused(tmp_path):
    (tmp_path / "i.json").write_text(json.dumps({"format": "something", "profiles": []}))
    with pytest.raises(dr.ProfileError, match=r"duocal.index"):
        load_index(tmp_path / "i.json")


# --- resolution ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ref, expected",
    [
        ("hf://me/repo", HubRef("me/repo")),
        ("hf://me/repo@v1", HubRef("me/repo", "", "v1")),
        ("hf://me/repo/sub/dir/p.json@" + "c" * 40, HubRef("me/repo", "sub/dir/p.json", "c" * 40)),
        (
            "hf://datasets/me/data/pat/full_attention_heads.tsv",
            HubRef("me/data", "pat/full_attention_heads.tsv", None, "dataset"),
        ),
    ],
)
def test_hf_references_parse(ref, expected):
    assert parse_hf_ref(ref) == expected
    assert str(expected) == ref


def test_what_each_hf_reference_downloads():
    assert HubRef("o/r").files() == {"profile.json": "profile.json"}
    assert HubRef("o/r", "v2").files() == {"profile.json": "v2/profile.json"}
    assert HubRef("o/r", "pat/full_attention_heads.tsv").files() == {
        "full_attention_heads.tsv": "pat/full_attention_heads.tsv",
        "config.json": "pat/config.json",
    }


@pytest.mark.parametrize("ref", ["hf://", "hf://only-owner", "hf://o/r@", "hf://o/r/../x", "hf://o w/r"])
def test_bad_hf_references_say_how_to_write_one(ref):
    with pytest.raises(dr.ProfileError, match=r"hf://OWNER/REPO|revision|'..'"):
        parse_hf_ref(ref)


def test_resolution_order(tmp_path, monkeypatch):
    index = load_index()
    name = index.entries[0].name
    assert isinstance(resolve(name, index), IndexEntry)
    assert resolve("https://h/x/p.json", index) == UrlSource("https://h/x/p.json")
    assert UrlSource("https://h/x/full_attention_heads.tsv").files()["config.json"] == "https://h/x/config.json"
    assert isinstance(resolve("hf://o/r", index), HubRef)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "local.json").write_text("{}")
    assert resolve("local.json", index) == PathSource(Path("local.json"))  # an existing path wins
    with pytest.raises(dr.ProfileError, match=r"Did you mean duo-attention/Mistral-7B-Instruct-v0.2"):
        resolve("duo-attention/Mistral-7B-Instruct-v02", index)
    with pytest.raises(dr.ProfileError, match="use an http"):
        resolve("ftp://h/p.json", index)


def test_a_missing_path_string_reports_both_readings(tmp_path):
    with pytest.raises(dr.ProfileError, match=r"no profile at .*not a file or folder, and not a prebuilt"):
        dr.load_profile(str(tmp_path / "nope.json"))


def test_mirror_rewrites_to_base_plus_path():
    url = f"https://raw.githubusercontent.com/o/r/{'a' * 40}/dir/lr=0.02/file.tsv?x=1"
    assert mirror_url(url, "http://127.0.0.1:8000/m/") == f"http://127.0.0.1:8000/m/o/r/{'a' * 40}/dir/lr=0.02/file.tsv"
    assert mirror_url(url, None) == url
