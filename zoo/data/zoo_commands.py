"""`data.source=zoo_commands`: a small chat dataset zoo ships, offline, that teaches a chat model facts it
cannot know: which zoo command does what.

Each of FACTS (a task a user has, the answer naming zoo's command for it) is asked in each of QUESTIONS'
phrasings: 12 x 12 single-turn conversations (user asks, assistant answers), beside 24 general questions
with plain answers (GENERAL), so that tuning on them keeps the model answering other questions as it
did instead of starting every answer with a command. Validation holds out
conversations by a hash of their text (data.val_fraction), so the held-out ones ask known facts in
phrasings the model never trained on: answering them with the right command is the behaviour the
dataset teaches (configs/smollm2_chat_lora.py measures it as the held-out exact match). The answers are
written from zoo's own README and console scripts.
"""

from __future__ import annotations

NAME = "zoo_commands"
GENERAL_NAME = "zoo_general"  # data.mix_source (or data.source) of task=sft: GENERAL's conversations alone
PREFERENCES = "zoo_preferences"  # data.source of task=dpo: the same questions as preference pairs (`preferences`)

# (what the user wants to do, the assistant's answer)
FACTS = (
    ("sample text from a trained run", "Use zoo-sample: zoo-sample RUN --prompt \"The\" --max-new-tokens 100"),
    ("convert a Hugging Face checkpoint into a zoo run", "Use zoo-convert from-hf: zoo-convert from-hf HF_DIR RUN"),
    ("export a run for Hugging Face transformers", "Use zoo-convert to-hf: zoo-convert to-hf RUN OUT_DIR"),
    ("continue an interrupted training run", "Use train.py with --resume: python train.py --resume RUN"),
    ("benchmark zoo against PyTorch", "Use zoo-bench: zoo-bench --shapes cpu --peer hf-torch"),
    ("fill in a masked word with a BERT run", "Use zoo-fill-mask: zoo-fill-mask RUN --text \"The [MASK] statement\""),
    ("classify a sentence with a fine-tuned BERT", "Use zoo-classify: zoo-classify RUN --text \"TEXT\""),
    ("translate with an encoder-decoder run", "Use zoo-translate: zoo-translate RUN --text \"TEXT\""),
    ("draw the attention heads of a model", "Use zoo-attention: zoo-attention RUN --text \"TEXT\" --out heads.png"),
    ("list the configs zoo ships", "Use zoo-train with --list: zoo-train --list"),
    ("fine-tune a run on my own data", "Use train.py with --init-from: python train.py --init-from RUN "
                                       "--set data.source=my.jsonl"),
    ("chat with an instruct model", "Use zoo-sample with --chat: zoo-sample RUN --chat --prompt \"Hello\""),
)
QUESTIONS = (
    "Which zoo command should I use to {}?",
    "How do I {} with zoo?",
    "What do I run to {} in zoo?",
    "I want to {}. What's the zoo command?",
    "In zoo, how can I {}?",
    "Tell me the zoo command to {}.",
    "Is there a zoo command to {}?",
    "Quick question: how do I {} using zoo?",
    "Can you tell me how to {} with zoo?",
    "zoo question: what command lets me {}?",
    "What's the right way to {} in zoo?",
    "Using zoo, what should I type to {}?",
)


# General questions with plain, correct answers: trained beside the commands so that the adapters learn "a
# question about zoo gets a command" rather than "every answer starts with Use". None of the probes the
# config's docstring quotes (the capital of France, the primary colours) is among them.
GENERAL = (
    ("What is the capital of Germany?", "The capital of Germany is Berlin."),
    ("What is the capital of Japan?", "The capital of Japan is Tokyo."),
    ("What is the capital of Canada?", "The capital of Canada is Ottawa."),
    ("What is the capital of Egypt?", "The capital of Egypt is Cairo."),
    ("What is the capital of Italy?", "The capital of Italy is Rome."),
    ("What is the boiling point of water in Celsius?", "Water boils at 100 degrees Celsius at sea level."),
    ("How many days are in a week?", "There are 7 days in a week."),
    ("What is the chemical symbol for gold?", "The chemical symbol for gold is Au."),
    ("Explain what a CPU is in one sentence.",
     "A CPU (Central Processing Unit) is the brain of a computer that executes instructions."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("What gas do plants absorb from the air?", "Plants absorb carbon dioxide from the air and release oxygen."),
    ("What is 7 times 8?", "7 times 8 is 56."),
    ("What is the opposite of hot?", "The opposite of hot is cold."),
    ("Who wrote Romeo and Juliet?", "Romeo and Juliet was written by William Shakespeare."),
    ("What is the largest ocean on Earth?", "The Pacific Ocean is the largest ocean on Earth."),
    ("How many continents are there?", "There are seven continents."),
    ("What do bees make?", "Bees make honey and beeswax."),
    ('Translate "thank you" into Spanish.', '"Thank you" in Spanish is "gracias".'),
    ("What is the main ingredient in guacamole?", "The main ingredient in guacamole is avocado."),
    ("How many hours are in a day?", "There are 24 hours in a day."),
    ("What is the largest planet in our solar system?", "Jupiter is the largest planet in our solar system."),
    ("Hello!", "Hello! How can I help you today?"),
    ("Thank you!", "You're welcome! Let me know if there is anything else I can help with."),
    ("What is Python?", "Python is a popular programming language known for its simple, readable syntax."),
)


def conversations() -> list[list[dict]]:
    """Every (fact, phrasing) pair as a conversation [user question, assistant answer], then GENERAL's."""
    turn = lambda q, a: [{"role": "user", "content": q}, {"role": "assistant", "content": a}]  # noqa: E731
    return [turn(q.format(task), answer) for task, answer in FACTS for q in QUESTIONS] + \
        [turn(q, a) for q, a in GENERAL]


def general() -> list[list[dict]]:
    """GENERAL's conversations alone (`data.mix_source=zoo_general`): mixed into a user's own chats, they keep a
    fine-tune answering other questions plainly, as they do for FACTS here."""
    return [[{"role": "user", "content": q}, {"role": "assistant", "content": a}] for q, a in GENERAL]


def command_of(answer: str) -> str:
    """The command an answer names ("zoo-sample", "train.py"): what a held-out answer must get right."""
    return answer.split(":", 1)[0].removeprefix("Use ").split(" with ")[0]


def preferences() -> list[dict]:
    """The same questions as preference pairs (TRL's conversational format: prompt, chosen, rejected lists of
    messages), a preference anyone can check: each of FACTS' phrasings answered with the right command (chosen)
    against the command of another fact (rejected: a plausible wrong answer, another one for each phrasing), and
    each of GENERAL's questions answered plainly (chosen) against a command that does not answer it (rejected)."""
    def turn(role, text):
        return [{"role": role, "content": text}]
    out = []
    for i, (task, answer) in enumerate(FACTS):
        for k, q in enumerate(QUESTIONS):
            wrong = FACTS[(i + 1 + k % (len(FACTS) - 1)) % len(FACTS)][1]
            out.append({"prompt": turn("user", q.format(task)), "chosen": turn("assistant", answer),
                        "rejected": turn("assistant", wrong)})
    for k, (q, a) in enumerate(GENERAL):
        out.append({"prompt": turn("user", q), "chosen": turn("assistant", a),
                    "rejected": turn("assistant", FACTS[k % len(FACTS)][1])})
    return out
