"""Reward functions for the tiny GRPO runs (tests/helpers/tiny_configs.grpo): a byte-level model's random
completions score differently on these, so their advantages are not all zero."""


def digits(prompts, completions, **columns) -> list[float]:
    """The share of a completion's characters that are digits (0 for an empty one)."""
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


def short(prompts, completions, **columns) -> list[float]:
    """1 / (1 + length): shorter completions score higher."""
    return [1.0 / (1 + len(text)) for text in completions]
