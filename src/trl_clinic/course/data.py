"""Synthetic data that tiny models can learn in a few hundred CPU steps, made from a seed.

Everything is drawn from one "fixed world": the same people with the same facts in every sample.
A 5M-parameter model cannot learn real reading comprehension in minutes, but it can learn a fixed
world, so lessons that need a learning curve get one. The lesson's seed picks which samples are
drawn; the world itself never changes, so the tokenizer and every lesson agree on it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from datasets import Dataset

WORLD_SEED = 1234

NAMES = (
    "alice bruno chloe dmitri elena farid greta hugo ines jonas kira liam "
    "mara nils olga pavel quinn rosa sven tara ugo vera wim yara"
).split()
ATTRIBUTES = {
    "city": "paris oslo lima cairo tokyo quito rome delhi accra hanoi".split(),
    "job": "baker pilot nurse farmer painter tailor miner sailor judge chemist".split(),
    "pet": "cat dog parrot rabbit turtle goat horse lizard hamster owl".split(),
    "color": "red blue green yellow purple orange black white silver brown".split(),
    "food": "bread rice soup cheese apples noodles beans fish honey olives".split(),
}
QUESTIONS = {
    "city": "where does {name} live?",
    "job": "what is the job of {name}?",
    "pet": "which pet does {name} keep?",
    "color": "what color does {name} like?",
    "food": "what does {name} eat?",
}
SENTENCES = {
    "city": "{name} lives in {value}.",
    "job": "{name} works as a {value}.",
    "pet": "{name} keeps a {value}.",
    "color": "{name} likes the color {value}.",
    "food": "{name} eats {value}.",
}
FILLER = (
    "the weather was mild that year. a market opened near the river. the old bridge was painted again. "
    "many travellers passed through the valley. the library kept long hours in winter."
).split(". ")


@dataclass(frozen=True)
class World:
    facts: dict[str, dict[str, str]]  # name -> attribute -> value

    def sentence(self, name: str, attribute: str) -> str:
        return SENTENCES[attribute].format(name=name, value=self.facts[name][attribute])

    def biography(self, name: str) -> str:
        return " ".join(self.sentence(name, attribute) for attribute in ATTRIBUTES)


def fixed_world() -> World:
    rng = random.Random(WORLD_SEED)
    return World({name: {attr: rng.choice(values) for attr, values in ATTRIBUTES.items()} for name in NAMES})


def instruction_pairs(n: int, seed: int, max_people: int = 6) -> Dataset:
    """Prompt/completion pairs whose completions range from one word to a few hundred characters.

    Guaranteed on every seed, by construction: rows alternate, even rows a short question answered
    by one word, odd rows the biographies of 1 to ``max_people`` people (a full sentence each, so
    always several times longer). So any two consecutive rows hold different numbers of label tokens,
    any window read in order mixes short and long answers, and every set of two rows or more has
    both kinds: unequal label counts are what make gradient-accumulation normalisation matter, and
    lessons 02 and 02b must not depend on a lucky draw to show it. The seed picks who and what.
    """
    world, rng = fixed_world(), random.Random(seed)
    rows = []
    for i in range(n):
        if i % 2 == 0:
            name, attribute = rng.choice(NAMES), rng.choice(list(ATTRIBUTES))
            rows.append(
                {
                    "prompt": QUESTIONS[attribute].format(name=name) + " answer:",
                    "completion": " " + world.facts[name][attribute] + ".",
                }
            )
        else:
            people = rng.sample(NAMES, rng.randint(1, max_people))
            rows.append(
                {
                    "prompt": "tell me about " + " and ".join(people) + ". answer:",
                    "completion": " " + " ".join(world.biography(name) for name in people),
                }
            )
    return Dataset.from_list(rows)


def mrc_samples(n: int, seed: int, min_sentences: int = 3, max_sentences: int = 40) -> Dataset:
    """Reading-comprehension samples: a passage of varied length, a question, a short answer in it.

    A passage has ``min_sentences`` to ``max_sentences`` sentences, then the answer's own sentence inserted among
    them: up to ``max_sentences + 1`` in all."""
    world, rng = fixed_world(), random.Random(seed)
    rows = []
    for _ in range(n):
        k = rng.randint(min_sentences, max_sentences)
        sentences = [
            rng.choice(FILLER).rstrip(".") + "."
            if rng.random() < 0.2
            else world.sentence(rng.choice(NAMES), rng.choice(list(ATTRIBUTES)))
            for _ in range(k)
        ]
        name, attribute = rng.choice(NAMES), rng.choice(list(ATTRIBUTES))
        sentences.insert(rng.randrange(len(sentences) + 1), world.sentence(name, attribute))
        rows.append(
            {
                "prompt": "passage: "
                + " ".join(sentences)
                + " question: "
                + QUESTIONS[attribute].format(name=name)
                + " answer:",
                "completion": " " + world.facts[name][attribute] + ".",
            }
        )
    return Dataset.from_list(rows)


def preference_pairs(n: int, seed: int, false_fact_share: float = 0.5) -> Dataset:
    """Question, a chosen answer that states the true fact asked for, and a rejected answer.

    Rejected answers come in two kinds: another true fact about the same person (the answer does
    not address the question) or the asked attribute with a false value (the model must know the
    world). Both need question and answer together, so a reward model has to learn something real,
    and the second kind needs capacity, which separates a trained reward head from a frozen one.
    """
    world, rng = fixed_world(), random.Random(seed)
    rows = []
    for _ in range(n):
        name = rng.choice(NAMES)
        asked, other = rng.sample(list(ATTRIBUTES), 2)
        if rng.random() < false_fact_share:
            wrong = rng.choice([v for v in ATTRIBUTES[asked] if v != world.facts[name][asked]])
            rejected = SENTENCES[asked].format(name=name, value=wrong)
        else:
            rejected = world.sentence(name, other)
        rows.append(
            {
                "prompt": QUESTIONS[asked].format(name=name) + " answer:",
                "chosen": " " + world.sentence(name, asked),
                "rejected": " " + rejected,
            }
        )
    return Dataset.from_list(rows)


CATEGORIES = {"cities": "city", "jobs": "job", "pets": "pet", "colors": "color", "foods": "food"}


def reward_prompts(n: int, seed: int) -> Dataset:
    """Prompts that ask for words of one category ("name some pets:"); the category travels as a column."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        category = rng.choice(list(CATEGORIES))
        rows.append({"prompt": f"name some {category}:", "category": category})
    return Dataset.from_list(rows)


def word_lists(n: int, seed: int, max_words: int = 6, match_share: float = 0.5) -> Dataset:
    """SFT warm start for the reward prompts: the format (a few category words) and a weak prior.

    Each word comes from the asked category with probability ``match_share``, else from any category.
    A randomly initialised policy gets almost no reward, and one warmed up on words that ignore the
    prompt learns to ignore it (GRPO then has no pathway to improve, measured); this warm start
    leaves a policy that answers in the right shape, half right, for GRPO to sharpen.
    """
    rng = random.Random(seed)
    every_word = [word for values in ATTRIBUTES.values() for word in values]
    rows = []
    for row in reward_prompts(n, seed):
        asked = ATTRIBUTES[CATEGORIES[row["category"]]]
        words = [
            rng.choice(asked) if rng.random() < match_share else rng.choice(every_word)
            for _ in range(rng.randint(2, max_words))
        ]
        rows.append({"prompt": row["prompt"], "completion": " " + " ".join(words)})
    return Dataset.from_list(rows)


def category_reward(completions: list[str], category: list[str], **kwargs) -> list[float]:
    """Share of the completion's words that belong to the asked category: partial credit.

    A random-init policy already hits a category word now and then (the vocabulary is small), so
    GRPO gets a signal from the first step; a 0/1 reward would give all-equal groups and no signal.
    TRL passes dataset columns (here ``category``) to reward functions as keyword arguments.
    """
    scores = []
    for text, asked in zip(completions, category):
        words = [w.strip(".,:;") for w in text.split()]
        wanted = set(ATTRIBUTES[CATEGORIES[asked]])
        scores.append(sum(w in wanted for w in words) / len(words) if words else 0.0)
    return scores


def all_in_category_reward(completions: list[str], category: list[str], **kwargs) -> list[float]:
    """1.0 only when every word is from the asked category: no partial credit, so a weak policy gets
    all-zero groups, zero advantages and no learning signal."""
    return [float(score == 1.0) for score in category_reward(completions, category)]


def corpus() -> list[str]:
    """Every kind of text the lessons produce, for training the tokenizer once."""
    texts = []
    for dataset in (
        instruction_pairs(400, seed=0),
        mrc_samples(100, seed=0),
        preference_pairs(200, seed=0),
        reward_prompts(50, seed=0),
    ):
        for row in dataset:
            texts.append(" ".join(str(value) for value in row.values()))
    return texts
