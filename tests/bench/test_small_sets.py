"""zoo.bench.small_sets: the user-like sets ask every fact, never in the held-out phrasing, and an answer counts
only when it holds its key."""

import pytest

from zoo.bench import small_sets


def test_sets_cover_every_fact_and_hold_the_held_out_phrasing_back():
    held = {r["messages"][1]["content"] for r in small_sets.held_out()}
    for n in (60, 200, 1000):
        rows = small_sets.chats(n)
        assert len(rows) == n and rows == small_sets.chats(n)  # repeatable
        asked = [r["messages"][1]["content"] for r in rows]
        assert not any(q.endswith(h) for q in asked for h in held)
        answers = [r["messages"][2]["content"] for r in rows]
        assert all(any(key in a for a in answers) for key, *_ in small_sets.FACTS)  # every fact taught
    assert len(held) == len(small_sets.FACTS) == 15


def test_an_answer_counts_only_with_its_key():
    class Echo:  # answers a fact's held-out question with its key only for the first three facts
        def chat(self, questions, system=None, max_new_tokens=0):
            keys = {q: key for key, *_, q in small_sets.FACTS}
            return [f"It is {keys[q]}." if q in keys and i < 3 else "Paris." if "France" in q else "I don't know."
                    for i, q in enumerate(questions)]
    right, known, answers = small_sets.score(Echo())
    assert (right, known) == (3, 1) and len(answers) == 20


def test_a_key_counts_as_a_word_of_its_own():
    assert small_sets.holds("It costs 2.50 euros.", "2.50") and small_sets.holds("Age 16.", "16")
    assert not small_sets.holds("30 minutes", "3") and not small_sets.holds("12.50 euros", "2.50")
    assert not small_sets.holds("It is 2.5", "2.50") and small_sets.holds("Paris!", "paris")


def test_bad_sizes_are_one_line_naming_the_option(capsys):
    with pytest.raises(SystemExit) as e:
        small_sets.main(["--sizes", "60,2OO"])
    assert e.value.code == 2 and "--sizes='60,2OO': give numbers of chats" in capsys.readouterr().err
