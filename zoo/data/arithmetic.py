"""`data.source=zoo_arithmetic`: sums and differences of numbers from 2 to 20, offline, with their answers: a task
whose every answer a program checks (zoo.rewards.exact_answer), for reinforcement learning from a reward
(task=grpo, configs/smollm2_grpo_lora.py). Each row is a conversation's prompt (a system message asking for the
answer's format, then the question) and its `answer`; validation holds rows out by a hash of their text."""

from __future__ import annotations

import random

NAME = "zoo_arithmetic"
SYSTEM = "Answer with one short sentence that ends with: The answer is N."


def rows(n: int = 400, seed: int = 0) -> list[dict]:
    """`n` distinct questions "What is A + B?" or "What is A - B?" (A, B from 2 to 20: 722 such), in a fixed order.
    Small numbers: SmolLM2-135M-Instruct answers about one in five of them right, so its sampled answers to one
    question differ in reward (two-digit operands: nearly none right, nothing for GRPO to compare)."""
    r, seen, out = random.Random(seed), set(), []
    while len(out) < n:
        a, b, op = r.randint(2, 20), r.randint(2, 20), r.choice("+-")
        if (a, b, op) in seen:
            continue
        seen.add((a, b, op))
        prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"What is {a} {op} {b}?"}]
        out.append({"prompt": prompt, "answer": str(a + b if op == "+" else a - b)})
    return out
