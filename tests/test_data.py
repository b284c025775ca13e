import re

from hypothesis import given, settings
from hypothesis import strategies as st

from trl_clinic.course import data


def names_in(text):
    return [word for word in re.findall(r"[a-z]+", text) if word in data.NAMES]


def test_same_seed_same_samples():
    assert data.instruction_pairs(20, seed=3).to_list() == data.instruction_pairs(20, seed=3).to_list()
    assert data.instruction_pairs(20, seed=3).to_list() != data.instruction_pairs(20, seed=4).to_list()


def test_world_is_fixed_across_seeds():
    assert data.fixed_world() == data.fixed_world()
    world = data.fixed_world()
    for row in data.instruction_pairs(50, seed=5):
        if len(row["completion"].split()) == 1:
            (name,) = names_in(row["prompt"])
            assert row["completion"].strip(" .") in world.facts[name].values()


def test_instruction_completion_lengths_vary_strongly(tokenizer):
    counts = [len(tokenizer(row["completion"])["input_ids"]) for row in data.instruction_pairs(200, seed=0)]
    assert min(counts) <= 3 and max(counts) >= 100


def test_mrc_answer_is_in_the_passage():
    for row in data.mrc_samples(30, seed=1):
        passage = row["prompt"].split(" question: ")[0]
        assert row["completion"].strip(" .") in passage


def test_mrc_passages_vary_in_length():
    lengths = [len(row["prompt"]) for row in data.mrc_samples(50, seed=2)]
    assert max(lengths) > 4 * min(lengths)


def test_preference_pairs_answer_the_question_or_not():
    world = data.fixed_world()
    for row in data.preference_pairs(30, seed=0):
        assert row["chosen"] != row["rejected"]
        (name,) = names_in(row["prompt"])
        assert row["chosen"].strip() in {world.sentence(name, a) for a in data.ATTRIBUTES}


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**32 - 1), max_people=st.integers(min_value=1, max_value=6))
def test_instruction_pairs_alternate_short_and_long_on_every_seed(seed, max_people):
    """Lessons 02 and 02b need unequal label counts in every window and on every process."""
    rows = data.instruction_pairs(12, seed=seed, max_people=max_people)
    words = [len(row["completion"].split()) for row in rows]
    assert all(w == 1 for w in words[::2]) and all(w >= 4 for w in words[1::2])


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_consecutive_instruction_pairs_have_unequal_label_counts(tokenizer, seed):
    counts = [len(tokenizer(row["completion"])["input_ids"]) for row in data.instruction_pairs(16, seed=seed)]
    assert all(a != b for a, b in zip(counts, counts[1:]))
    assert max(counts[::2]) < min(counts[1::2])  # every short answer is shorter than every long one
