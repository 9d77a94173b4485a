"""lm.logprobs(prompts, answers=...): an answer's log-probabilities given its prompt, its tokens only, are the
log-softmax of apply's logits at those tokens, and the sum a DPO run computes for the same pair (text and chat
formats); a prompt's own tokens, its assistant turns included, never count; bad pairs end in one typed line. And
lm.batch takes conversations on a DPO run's checkpoint, rendered with its chat template as an SFT run's are."""

import dataclasses

import jax
import numpy as np
import pytest

import zoo
from tests.helpers import tiny_configs
from tests.helpers.runs import run, write_jsonl
from zoo.errors import ArgumentError
from zoo.tasks import preference

EOT = 256  # the byte tokenizer's end-of-text id, which the default chat template's eos_token encodes to


@pytest.fixture(scope="module")
def dpo_run(tmp_path_factory, cache_dir):
    """A tiny DPO run (tiny_configs.dpo: sums, the right one chosen; the reference precomputed), 2 steps, in a
    window of 64 tokens, all the model's positions (a multi-turn prompt's row is 63)."""
    cfg = tiny_configs.dpo(cache_dir)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, seq_len=64),
                              train=dataclasses.replace(cfg.train, steps=2, save_every=2, eval_every=0))
    work = tmp_path_factory.mktemp("answer-logprobs") / "run"
    run(cfg, work, devices=jax.devices()[:1])
    return {"cfg": cfg, "lm": zoo.load(str(work))}


def user(text):
    return [{"role": "user", "content": text}]


def by_hand(lm, ids: list[int], n_answer: int) -> np.ndarray:
    """The last n_answer tokens' log-probabilities: the full row's log-softmax over apply's logits, gathered."""
    logits_1TV = lm.apply(lm.params, {"inputs": np.asarray([ids[:-1]], np.int32)})
    lp_T = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits_1TV[0].astype(np.float32))),
                              np.asarray(ids[1:])[:, None], -1)[:, 0]
    return lp_T[-n_answer:]


def chat_ids(*turns: tuple[str, str]) -> list[int]:
    """The default chat template's rendering of (role, content) turns, as byte ids, written out by hand."""
    out = []
    for role, content in turns:
        out += [*f"<|{role}|>\n{content}".encode(), EOT]
    return out


def test_an_answers_logprobs_are_the_log_softmax_of_apply_at_its_tokens_only(dpo_run):
    lm = dpo_run["lm"]
    # A text prompt: the answer follows as plain text, then the end-of-text id; the answer's bytes and the eot scored.
    got = lm.logprobs("3+4=", answers="17")
    want = by_hand(lm, [*b"3+4=17", EOT], 3)
    assert got.dtype == np.float32 and got.shape == (3,)
    np.testing.assert_allclose(got, want, atol=2e-5)
    # A conversation (a user string given as a message): rendered with the run's template, the answer the
    # assistant's turn, its end-of-turn scored; a list of messages as the answer is the same pair.
    got = lm.logprobs(user("3+4?"), answers="7")
    np.testing.assert_allclose(got, by_hand(lm, chat_ids(("user", "3+4?"), ("assistant", "7")), 2), atol=2e-5)
    np.testing.assert_array_equal(lm.logprobs(user("3+4?"), answers=[{"role": "assistant", "content": "7"}]), got)
    # Lists: one array per pair, in order, whatever their lengths (rows are sorted and bucketed inside).
    many = lm.logprobs(["3+4=", user("3+4?"), "12+30="], answers=["17", "7", "42 exactly"], batch_size=2)
    assert [len(a) for a in many] == [3, 2, 11]
    np.testing.assert_allclose(many[1], got, atol=2e-5)
    np.testing.assert_allclose(many[2], by_hand(lm, [*b"12+30=42 exactly", EOT], 11), atol=2e-5)


def test_a_prompts_tokens_never_count_its_assistant_turns_included(dpo_run):
    lm = dpo_run["lm"]
    prompt = [*user("1+1?"), {"role": "assistant", "content": "2"}, *user("and 3+4?")]
    got = lm.logprobs(prompt, answers="7")
    ids = chat_ids(("user", "1+1?"), ("assistant", "2"), ("user", "and 3+4?"), ("assistant", "7"))
    assert got.shape == (2,)  # "7" and its end-of-turn: not the prompt's "2" + end-of-turn the template marks too
    np.testing.assert_allclose(got, by_hand(lm, ids, 2), atol=2e-5)
    # The prompt conditions the answer, but its tokens are not summed: a longer prompt gives as many numbers.
    text = lm.logprobs("1+1=2. 3+4=", answers="7")
    assert text.shape == (2,) and abs(text.sum() - lm.logprobs("3+4=", answers="7").sum()) > 1e-4


def test_an_answers_sum_is_what_the_dpo_task_computes_for_the_pair(dpo_run, tmp_path):
    lm, cfg = dpo_run["lm"], dpo_run["cfg"]
    task = preference.DpoTask(cfg)
    text_rows = tiny_configs.preference_pairs(6)
    chat_rows = [{"prompt": user(f"{a}+{a + 1}?"), "chosen": [{"role": "assistant", "content": str(2 * a + 1)}],
                  "rejected": [{"role": "assistant", "content": f"{2 * a + 3}, I think"}]} for a in range(1, 6)]
    for name, rows in (("text", text_rows), ("chat", chat_rows)):
        data = dataclasses.replace(cfg.data, source=write_jsonl(tmp_path / f"{name}.jsonl", rows))
        pairs, _, counts = preference.encode_pairs(data, lm.tokenizer, preference.template_of(data))
        assert len(pairs) == len(rows) and counts["truncated"] == 0
        batch = pairs.rows(np.arange(len(pairs)))
        dpo_B2, lengths_B2, _ = task.logps(lm.params, batch, False, jax.random.PRNGKey(0))
        for col, side in enumerate(("chosen", "rejected")):
            got = lm.logprobs([r["prompt"] for r in rows], answers=[r[side] for r in rows])
            np.testing.assert_allclose([g.sum() for g in got], np.asarray(dpo_B2)[:, col], rtol=1e-5, atol=1e-5)
            assert [len(g) for g in got] == np.asarray(lengths_B2)[:, col].tolist()


BAD = [  # (what, prompts, answers, the error's piece)
    ("two answers for one prompt", "1+1=", ["2", "3"], "one prompt was given; give its answer"),
    ("fewer answers than prompts", ["1+1=", "2+2="], ["2"], "answers: 1 for 2 prompts"),
    ("answers not a list", ["1+1=", "2+2="], "2", "answers: '2' for 2 prompts"),
    ("an empty answer", ["1+1=", "2+2="], ["2", ""], "pair 1: the answer is empty"),
    ("a blank answer", "1+1=", "  ", "the pair: the answer is blank"),
    ("an empty prompt", "", "2", "the pair: the prompt is empty"),
    ("a number for a prompt", 3, "2", "prompts=3: give a text, a conversation"),
    ("a number for an answer", ["1+1="], [2], "pair 0: the answer is 2; give a string"),
    ("messages after a text prompt", "1+1=", [{"role": "assistant", "content": "2"}], "a text prompt with an answer "
     "of messages"),
    ("an answer with no assistant turn", user("1+1?"), user("2"), "the answer has no non-empty assistant message"),
    ("a message without content", [{"role": "user"}], "2", "the prompt: message 0 has no 'content'"),
    ("a pair longer than the window", "1" * 300, "2", "the prompt and answer need a window of"),
]


@pytest.mark.parametrize("what, prompts, answers, piece", BAD, ids=[b[0] for b in BAD])
def test_bad_pairs_are_one_typed_line(dpo_run, what, prompts, answers, piece):
    with pytest.raises(ArgumentError) as e:
        dpo_run["lm"].logprobs(prompts, answers=answers)
    assert piece in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_batch_takes_conversations_on_a_dpo_runs_checkpoint(dpo_run):
    lm = dpo_run["lm"]
    assert lm.config.task == "dpo"
    conv = [*user("3+4?"), {"role": "assistant", "content": "7"}]
    batch = lm.batch([conv, "3+4=7"])
    ids = chat_ids(("user", "3+4?"), ("assistant", "7"))
    n = len(ids) - 1
    np.testing.assert_array_equal(batch["inputs"][0, :n], ids[:-1])
    np.testing.assert_array_equal(batch["targets"][0, :n], ids[1:])
    # The loss on the assistant's tokens alone ("7" and its end-of-turn), as an SFT run's batch puts it.
    np.testing.assert_array_equal(np.nonzero(batch["weights"][0])[0], [n - 2, n - 1])
    assert batch["weights"][1].sum() == len("3+4=7") + 1  # a text: every token and the end-of-text
    logits = lm.apply(lm.params, batch)
    assert logits.shape == (*batch["inputs"].shape, lm.config.model.vocab_size)
    # Its answer's log-probabilities, read off apply's logits at the weighted targets, are logprobs(answers=)'s.
    lp_BT = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), batch["targets"][..., None], -1)[..., 0]
    np.testing.assert_allclose(lp_BT[0][batch["weights"][0] > 0], lm.logprobs(user("3+4?"), answers="7"), atol=2e-5)
    with pytest.raises(ArgumentError, match="loss_fn of a dpo model reads pairs"):  # not a shape error deep in jax
        lm.loss_fn(lm.params, batch)
