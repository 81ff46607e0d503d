"""Needle values of every kind (number, word pair, UUID): drawn from a seed, recognised by their shape, and an
answer scored exact when its first span of the key's shape is the key, clean when no phrase repeats before it."""

import random

import pytest

from duocal.data.needle_values import VALUE_KINDS, draw_value, first_value, kind_of
from duocal.measure.chat_answer import ChatAnswer


@pytest.mark.parametrize("kind", VALUE_KINDS)
def test_values_are_drawn_from_the_seed_and_have_their_kinds_shape(kind):
    drawn = [draw_value(kind, random.Random(f"s:{i}")) for i in range(20)]
    assert drawn == [draw_value(kind, random.Random(f"s:{i}")) for i in range(20)]
    assert len(set(drawn)) >= 15 and all(kind_of(v) == kind for v in drawn)


def test_numbers_keep_the_draws_of_earlier_releases():
    assert draw_value("number", random.Random(7)) == str(random.Random(7).randint(10000, 99999))


def test_unknown_kinds_and_values_are_refused():
    with pytest.raises(ValueError, match="number, word, uuid"):
        draw_value("emoji", random.Random(1))
    with pytest.raises(ValueError, match="is not a needle value"):
        kind_of("two words")


CASES = [
    (71432, "The pass key is 71432. Remember it.", True, True),
    (71432, "The pass key is the pass key is 71432.", True, False),
    (71432, "The pass key is 71433.", False, True),
    ("amber-falcon", "The pass key is Amber-Falcon.", True, True),
    ("amber-falcon", "The pass key is amber-heron.", False, True),
    ("amber-falcon", "The pass key is the pass key is amber-falcon", True, False),
    ("amber-falcon", "I do not know.", False, True),
    ("3f2a9c4e-1b7d-4e2a-9c3f-5d8e7a6b4c21", "The pass key is 3f2a9c4e-1b7d-4e2a-9c3f-5d8e7a6b4c21.", True, True),
    ("3f2a9c4e-1b7d-4e2a-9c3f-5d8e7a6b4c21", "The pass key is 3f2a9c4e-1b7d-4e2a-9c3f-5d8e7a6b4c2.", False, True),
    ("3f2a9c4e-1b7d-4e2a-9c3f-5d8e7a6b4c21", "The key is 3f2a9c4e-1b7d.", False, True),
]


@pytest.mark.parametrize("key, said, exact, clean", CASES)
def test_answers_score_by_the_first_span_of_the_keys_shape(key, said, exact, clean):
    answer = ChatAnswer("tune", key, said)
    assert (answer.exact, answer.clean) == (exact, clean)


def test_the_first_value_is_the_first_span_of_its_shape():
    assert first_value("number", "code 12 then 71432").group() == "12"
    assert first_value("word", "say RED-fox now").group() == "red-fox"
    assert first_value("uuid", "no uuid here 1234") is None
