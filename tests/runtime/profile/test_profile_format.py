import json
import math

import pytest
from transformers import LlamaConfig

import duocal_runtime as dr
from duocal_runtime.profile.format import profile_to_json

from helpers.profiles import random_profile


def write(tmp_path, data, name="p.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_round_trip_is_exact_and_stable(tmp_path):
    profile = random_profile(seed=3)
    path = dr.save_profile(profile, tmp_path / "a.json")
    loaded = dr.load_profile(path)
    assert loaded == profile
    dr.save_profile(loaded, tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


def test_json_is_diff_friendly_one_row_per_line(tmp_path):
    profile = random_profile(layers=5, kv_heads=3, heads=6)
    text = profile_to_json(profile)
    rows = [line for line in text.splitlines() if line.startswith("    [")]
    assert len(rows) == 5
    assert json.loads(text)["scores"] == [list(r) for r in profile.scores]


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path, monkeypatch):
    profile = random_profile()
    target = dr.save_profile(profile, tmp_path / "p.json")
    before = target.read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr("os.fsync", boom)
    with pytest.raises(OSError):
        dr.save_profile(random_profile(seed=9), target)
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]


def valid_dict():
    return random_profile().to_dict()


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(format="other"), "unknown format"),
        (lambda d: d.update(version=4), "unsupported profile version 4"),
        (
            lambda d: d.update(version=1, measurements={"retrieval": {"scores": [[0.5]]}}),
            "measurements need profile version 2",
        ),
        (lambda d: d.pop("scores"), "missing field 'scores'"),
        (lambda d: d["model"].pop("head_dim"), "missing field 'model.head_dim'"),
        (lambda d: d["scores"][1].__setitem__(0, float("nan")), "score [1][0] is nan"),
        (lambda d: d["scores"][2].__setitem__(1, float("inf")), "score [2][1] is inf"),
        (lambda d: d["scores"][0].__setitem__(1, 1.5), "outside [0, 1]"),
        (lambda d: d["scores"][0].__setitem__(1, -0.01), "outside [0, 1]"),
        (lambda d: d["scores"][3].append(0.5), "ragged"),
        (lambda d: d["scores"].pop(), "scores is 3x2 but the model block says 4 layers x 2 KV heads"),
        (lambda d: d["model"].update(fingerprint="sha256:0000000000000000"), "fingerprint mismatch"),
        (lambda d: d["model"].update(num_key_value_heads=3), "must be a multiple"),
        (lambda d: d["deploy"].update(sparsity=2), "deploy.sparsity"),
        (lambda d: d["deploy"].update(policy="full"), "deploy.policy"),
        (lambda d: d["deploy"].update(bogus=1), "unknown deploy field"),
        (lambda d: d["deploy"].update(sink=16), "unknown deploy field(s) ['sink'] (profile version 3)"),
        (lambda d: d["deploy"]["sizes"].update(nope={"sink": 1}), "deploy.sizes.nope: unknown policy 'nope'"),
        (lambda d: d["deploy"]["sizes"].update(h2o={"heavy": 8, "sink": 1}), "deploy.sizes.h2o: h2o: unknown size"),
        (lambda d: d["deploy"]["sizes"].update(h2o={"heavy": 0}), "deploy.sizes.h2o: h2o: heavy must be a positive"),
        (lambda d: d["deploy"].update(sizes=[1]), "deploy.sizes must be an object"),
        (lambda d: d.update(version=1), "unknown deploy field(s) ['sizes'] (profile version 1)"),
    ],
)
def test_every_validation_error_is_clear(tmp_path, mutate, message):
    data = valid_dict()
    mutate(data)
    path = tmp_path / "bad.json"
    # json.dumps writes NaN/Infinity, which Python's json reads back: the validator must catch them
    path.write_text(json.dumps(data))
    with pytest.raises(dr.ProfileError) as err:
        dr.load_profile(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("content, message", [('{"format": ', "corrupt or truncated"), ("[1, 2]", "JSON object")])
def test_corrupt_files(tmp_path, content, message):
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(dr.ProfileError, match=message):
        dr.load_profile(path)


def test_binary_garbage_and_missing_file(tmp_path):
    path = tmp_path / "p.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(dr.ProfileError, match="not a text JSON file"):
        dr.load_profile(path)
    with pytest.raises(dr.ProfileError, match="no profile at"):
        dr.load_profile(tmp_path / "missing.json")


def test_fingerprint_depends_on_kv_fields_only():
    a = LlamaConfig(num_hidden_layers=4, hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    b = LlamaConfig(num_hidden_layers=4, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=77)
    c = LlamaConfig(num_hidden_layers=4, hidden_size=64, num_attention_heads=4, num_key_value_heads=4)
    assert dr.config_fingerprint(a) == dr.config_fingerprint(b) != dr.config_fingerprint(c)
    assert dr.shape_of_config(a) == dr.ModelShape(4, 4, 2, 16)


def test_shape_mismatch_names_both_shapes():
    profile = random_profile(layers=4, kv_heads=2, heads=4, head_dim=8)
    config = LlamaConfig(num_hidden_layers=6, hidden_size=64, num_attention_heads=8, num_key_value_heads=2)
    with pytest.raises(dr.ProfileError) as err:
        profile.check_compatible(config)
    assert "4 layers x 2 KV heads" in str(err.value) and "6 layers x 2 KV heads" in str(err.value)
    ok = LlamaConfig(num_hidden_layers=4, hidden_size=32, num_attention_heads=4, num_key_value_heads=2)
    profile.check_compatible(ok)


def test_scores_are_read_back_as_floats(tmp_path):
    data = valid_dict()
    data["scores"][0][0] = 1  # an integer is a valid score
    profile = dr.load_profile(write(tmp_path, data))
    assert isinstance(profile.scores[0][0], float) and math.isclose(profile.scores[0][0], 1.0)
