"""Stand-ins for the reward functions the zoo's GRPO recipes name, which live in their authors' code (open-r1's
``src/open_r1/rewards.py``, the LLM course's pages) and cannot run on the zoo's models. Each is labelled with what it
stands for. Recipes name them by dotted path (``zoo_rewards.accuracy``), as TRL's ``grpo`` script loads any reward.

The zoo's policies are tiny random models: they never write ``<think>`` tags or a right answer, so the originals'
0/1 rewards would give every completion of every group 0, and a GRPO run that teaches nothing, which the authors'
pretrained policies do not have. What ``equal_rewards`` asks of a healthy recipe is whether its rewards separate a
group's completions; each stand-in keeps what its original rewards (the answer, the tags, the format) and gives the
partial credit a random policy can earn: the share of the characters of what it rewards that the completion holds.
The broken twin's reward (``constant``) ignores the completion.
"""

from __future__ import annotations


def _text(completion) -> str:
    """A completion as text: TRL passes conversational completions as message lists."""
    return completion[-1]["content"] if isinstance(completion, list) else completion


def _overlap(completion, reference: str) -> float:
    """The share of ``reference``'s distinct characters that the completion holds: partial credit with spread."""
    wanted = set(reference)
    return len(wanted & set(_text(completion))) / len(wanted) if wanted else 0.0


FORMAT = "<think>\n...\n</think>\n<answer>\n...\n</answer>"  # open-r1's format
REASONING = "<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>\n"  # the unsloth notebook's


def accuracy(completions, solution, **kwargs) -> list[float]:
    """Stands for open-r1's ``accuracy_reward`` and TRL's (math_verify against the solution): what of the solution
    the completion holds."""
    return [_overlap(c, s) for c, s in zip(completions, solution)]


def format(completions, **kwargs) -> list[float]:  # noqa: A001 - the recipe's own name for it
    """Stands for open-r1's ``format_reward`` (``<think>...</think><answer>...</answer>``, 0/1): what of the format
    the completion holds."""
    return [_overlap(c, FORMAT) for c in completions]


def tag_count(completions, **kwargs) -> list[float]:
    """Stands for open-r1's ``tag_count_reward`` (0.25 a tag): what of the four tags the completion holds."""
    return [_overlap(c, "<think>\n</think>\n<answer>\n</answer>") for c in completions]


def code_format(completions, **kwargs) -> list[float]:
    """Stands for open-r1's ``code_format_reward`` (think tags and a fenced block): what of them the completion
    holds."""
    return [_overlap(c, "</think>\n```python\n```") for c in completions]


def reward_len(completions, **kwargs) -> list[float]:
    """The LLM course's ``reward_len`` (chapter 12, page 5): ``-abs(50 - len(completion))``, as the page writes it
    (it needs no stand-in: a random policy's completions differ in length)."""
    return [-abs(50 - len(_text(c))) for c in completions]


def xml_count(completions, **kwargs) -> list[float]:
    """Stands for the course's ``xmlcount_reward_func`` (0.125 a tag): what of the tags the completion holds."""
    return [0.5 * _overlap(c, REASONING) for c in completions]


def soft_format(completions, **kwargs) -> list[float]:
    """Stands for the course's ``soft_format_reward_func`` (0.5 for reasoning then answer tags)."""
    return [0.5 * _overlap(c, REASONING) for c in completions]


def strict_format(completions, **kwargs) -> list[float]:
    """Stands for the course's ``strict_format_reward_func`` (0.5 for the exact layout)."""
    return [0.5 * _overlap(c, REASONING) for c in completions]


def integer(completions, **kwargs) -> list[float]:
    """Stands for the course's ``int_reward_func`` (0.5 for an integer answer): what of the digits it holds."""
    return [0.5 * _overlap(c, "0123456789") for c in completions]


def correctness(completions, solution, **kwargs) -> list[float]:
    """Stands for the course's ``correctness_reward_func`` (2.0 for the right answer)."""
    return [2.0 * _overlap(c, s) for c, s in zip(completions, solution)]


def constant(completions, **kwargs) -> list[float]:
    """Not a recipe's: the broken twin's reward, the same for every completion (TRL #3857's reward that ignores
    the completion), so every GRPO group has equal rewards and teaches nothing."""
    return [1.0 for _ in completions]


# the names the recipes give, and the stand-in each takes
NAMES = {
    "accuracy": "zoo_rewards.accuracy",
    "format": "zoo_rewards.format",
    "tag_count": "zoo_rewards.tag_count",
    "code": "zoo_rewards.accuracy",
    "binary_code": "zoo_rewards.accuracy",
    "code_format": "zoo_rewards.code_format",
    "ioi_code": "zoo_rewards.accuracy",
    "cf_code": "zoo_rewards.accuracy",
    "reward_len": "zoo_rewards.reward_len",
    "xmlcount_reward_func": "zoo_rewards.xml_count",
    "soft_format_reward_func": "zoo_rewards.soft_format",
    "strict_format_reward_func": "zoo_rewards.strict_format",
    "int_reward_func": "zoo_rewards.integer",
    "correctness_reward_func": "zoo_rewards.correctness",
}
