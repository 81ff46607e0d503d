"""Fuzzing the loaders: random JSON trees, mutations of a real profile, of upstream TSVs, of
recipes and of key=value overrides. Each loader returns a valid object or raises the project's
documented error (ProfileError / ValueError), never anything else, and quickly."""

import json
import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import duocal_runtime as dr
from duocal.calibrate.recipe import Recipe, load_recipe, recipe_from_dict
from duocal_runtime.profile.upstream import parse_upstream_tsv

from helpers.paths import UPSTREAM_PATTERNS
from helpers.profiles import random_profile

FUZZ = settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
REAL = random_profile(layers=3, kv_heads=2, heads=4, head_dim=8).to_dict()

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
trees = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=20,
)


def paths(tree, prefix=()):
    yield prefix
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from paths(v, (*prefix, k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from paths(v, (*prefix, i))


ALL_PATHS = [p for p in paths(REAL) if p]


def replaced(tree, path, value):
    tree = json.loads(json.dumps(tree))
    node = tree
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return tree


def must_load_or_refuse(load, data, errors):
    start = time.perf_counter()
    try:
        result = load(data)
    except errors:
        result = None
    assert time.perf_counter() - start < 2.0
    return result


@FUZZ
@given(trees)
def test_random_json_is_a_profile_or_a_profile_error(tree):
    must_load_or_refuse(dr.profile_from_dict, tree, dr.ProfileError)


@FUZZ
@given(st.sampled_from(ALL_PATHS), scalars | trees)
def test_a_mutated_real_profile_loads_valid_or_is_refused(path, value):
    profile = must_load_or_refuse(dr.profile_from_dict, replaced(REAL, path, value), dr.ProfileError)
    if profile is not None:  # whatever was accepted is a usable profile
        assert all(0.0 <= s <= 1.0 and math.isfinite(s) for s in profile.flat_scores())
        dr.plan(profile)


@FUZZ
@given(st.text(alphabet="0123456789.e-+\tnaif \n", max_size=80))
def test_upstream_tsv_text_is_rows_of_finite_numbers_or_refused(text):
    rows = must_load_or_refuse(parse_upstream_tsv, text, dr.ProfileError)
    if rows is not None:
        assert rows and all(math.isfinite(x) for row in rows for x in row)


@pytest.mark.parametrize(
    ("bad", "says"),
    [("nan", "non-finite"), ("inf", "non-finite"), ("-inf", "non-finite"), ("1e999", "non-finite"),
     ("x", "not tab-separated numbers"), ("", "line 2 holds 8 gates and the first line 7")],
)  # fmt: skip
def test_a_real_upstream_tsv_with_one_bad_cell_is_refused_naming_it(bad, says):
    tsv = (UPSTREAM_PATTERNS / "Mistral-7B-Instruct-v0.2" / "full_attention_heads.tsv").read_text()
    assert len(parse_upstream_tsv(tsv)) == 32
    with pytest.raises(dr.ProfileError, match=says):
        parse_upstream_tsv(tsv.replace(tsv.split("\t")[3], bad, 1))


RECIPE = Recipe().to_dict()
RECIPE_PATHS = [p for p in paths(RECIPE) if p and p[0] != "source"]


@FUZZ
@given(st.sampled_from(RECIPE_PATHS), scalars | trees)
def test_a_mutated_recipe_is_valid_or_a_value_error(path, value):
    recipe = must_load_or_refuse(recipe_from_dict, replaced(RECIPE, path, value), ValueError)
    if recipe is not None:  # accepted values are typed and finite
        assert math.isfinite(recipe.train.lr) and recipe.train.steps >= 1 and 0 <= recipe.deploy.sparsity <= 1


@FUZZ
@given(trees)
def test_a_random_recipe_tree_is_valid_or_a_value_error(tree):
    must_load_or_refuse(recipe_from_dict, tree, ValueError)


@FUZZ
@given(st.lists(st.text(alphabet="abcdefghijklmnopqrstuvwxyz._=[]{}:,0123456789-\"' ", max_size=30), max_size=3))
def test_key_value_overrides_are_applied_or_a_value_error(overrides):
    must_load_or_refuse(lambda o: load_recipe(None, o), overrides, ValueError)


@pytest.mark.parametrize("text", ["[" * 50_000, "{" * 50_000, '{"a":' * 50_000])
def test_pathologically_nested_profile_files_are_refused(tmp_path, text):
    path = tmp_path / "deep.json"
    path.write_text(text)
    with pytest.raises(dr.ProfileError):
        dr.load_profile(str(path))


def test_a_profile_that_gives_a_key_twice_is_refused_not_read_last_wins(tmp_path):
    text = json.dumps(REAL)
    assert text.startswith('{"format": ')
    path = tmp_path / "twice.json"
    path.write_text('{"format": "not a profile", ' + text[1:])  # valid JSON, the first "format" shadowed
    assert json.loads(path.read_text())["format"] == REAL["format"]  # what a plain reader would take
    with pytest.raises(dr.ProfileError, match="'format' appears twice"):
        dr.load_profile(str(path))


@pytest.mark.parametrize("text", ['{"profiles": ' + "[" * 50_000, '{"version": 1, "version": 2}'])
def test_an_index_nested_too_deeply_or_with_a_key_twice_is_a_profile_error(tmp_path, text):
    path = tmp_path / "index.json"
    path.write_text(text)
    with pytest.raises(dr.ProfileError, match="prebuilt index"):
        dr.load_index(str(path))
