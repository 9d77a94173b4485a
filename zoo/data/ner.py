"""The offline labelled set of task=bert_tokens (data.source=builtin): short synthetic English sentences with
CoNLL-2003-style word tags, made here by a deterministic generator, not drawn from any real corpus.

Each sentence fills a template ("Yesterday {PER} joined {ORG} in {LOC} .") with names from small lists of
people, places and organisations, one to three words each, tagged in IOB2 (B-TYPE on an entity's first
word, I-TYPE on the rest, O elsewhere). The templates put capitalised words that are no entity at the
start of a sentence and after "on" / "in" (days, months), and "Jordan" is both a person and a place, so
neither capitals nor the word alone decide a tag: the context does. Columns as the Hugging Face conll2003
dataset has them: `tokens` (words) and `ner_tags` (ClassLabel ids over TAGS).
"""

from __future__ import annotations

import datasets
import numpy as np

TAGS = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG")
NAMES = {
    "PER": ("Ada Lovelace", "Alan Turing", "Grace Hopper", "Guido van Rossum", "Linus", "Margaret Hamilton",
            "Jordan", "Jordan Peele", "Edsger Dijkstra", "Barbara Liskov", "Ken Thompson", "Katherine Johnson",
            "Donald Knuth", "Frances Allen", "Dennis Ritchie", "Radia Perlman", "Tim", "Sophie Wilson"),
    "LOC": ("Paris", "New York", "Buenos Aires", "Cape Town", "Jordan", "Oslo", "Kyoto", "Lagos", "Lima",
            "Rio de Janeiro", "Quebec", "Nairobi", "Hanoi", "San Francisco", "Berlin", "Perth"),
    "ORG": ("Acme Corp", "United Nations", "Python Software Foundation", "Red Cross", "Bell Labs", "NASA",
            "Unicef", "Initech", "World Bank", "Mozilla", "Globex", "Open Data Institute"),
}
FILLERS = {"DAY": ("Monday", "Tuesday", "Friday", "Sunday"), "MONTH": ("March", "May", "June", "October")}
TEMPLATES = (
    "{PER} flew to {LOC} on {DAY} .",
    "Yesterday {PER} joined {ORG} in {LOC} .",
    "The {ORG} office in {LOC} hired {PER} in {MONTH} .",
    "{ORG} opened a lab near {LOC} .",
    "In {LOC} , {PER} met {PER} on {DAY} .",
    "Later {PER} left {ORG} for {ORG} .",
    "Reports from {LOC} say {ORG} will grow in {MONTH} .",
    "{PER} and {PER} wrote about {LOC} .",
    "On {DAY} the {ORG} team visited {LOC} .",
    "Nobody at {ORG} knew {PER} .",
    "She moved from {LOC} to {LOC} in {MONTH} .",
    "Everyone in {LOC} reads what {PER} writes .",
)
NUM_SENTENCES = 3000


def sentence(template: str, rng: np.random.RandomState) -> tuple[list[str], list[str]]:
    """(words, IOB2 tags) of one filled template."""
    words, tags = [], []
    for piece in template.split():
        slot = piece[1:-1] if piece.startswith("{") else None
        if slot in NAMES:
            name = NAMES[slot][rng.randint(len(NAMES[slot]))].split()
            words += name
            tags += [f"B-{slot}"] + [f"I-{slot}"] * (len(name) - 1)
        else:
            words.append(FILLERS[slot][rng.randint(len(FILLERS[slot]))] if slot else piece)
            tags.append("O")
    return words, tags


def builtin_examples(n: int = NUM_SENTENCES, seed: int = 0) -> datasets.Dataset:
    """n sentences (the same ones every time): tokens [words], ner_tags [ClassLabel ids over TAGS]."""
    rng = np.random.RandomState(seed)
    rows = [sentence(TEMPLATES[rng.randint(len(TEMPLATES))], rng) for _ in range(n)]
    features = datasets.Features({"tokens": datasets.List(datasets.Value("string")),
                                  "ner_tags": datasets.List(datasets.ClassLabel(names=list(TAGS)))})
    return datasets.Dataset.from_dict({"tokens": [w for w, _ in rows],
                                       "ner_tags": [[TAGS.index(t) for t in tags] for _, tags in rows]},
                                      features=features)
