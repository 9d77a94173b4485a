"""Chat fine-tuning (sft): a packed row gives each example the loss and gradients it has alone and unpadded
(learned and rotary positions); the loss falls on the assistant's tokens and their end-of-turn only,
token-weighted over the batch; long examples are truncated or dropped and answerless ones dropped, each
counted; exact match counts answers whose every token is right; a run trains, logs the real-token share
and keeps its chat template beside it; bad conversations are one line naming the row."""

import dataclasses
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.runs import run, write_jsonl
from zoo.configuration import Config, DataConfig, OptimConfig, TrainConfig
from zoo.errors import ZooDataError
from zoo.models.gpt import GptConfig
from zoo.tasks import sft

GPT = GptConfig(vocab_size=264, max_len=128, num_layers=2, d_model=32, num_heads=4, d_ff=64, dropout=0.0)
LLAMA = dataclasses.replace(GPT, positions="rope", norm="rmsnorm", mlp="swiglu", num_kv_heads=2, qkv_bias=False,
                            out_bias=False, mlp_bias=False, tie_embeddings=False)
CHATS = [[{"role": "user", "content": f"what is {a} plus {b}?"}, {"role": "assistant", "content": str(a + b)}]
         for a in range(6) for b in range(5)]
CHATS.append([{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"},
              {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"},
              {"role": "assistant", "content": "ciao"}])


def sft_cfg(tmp_path, source, model=GPT, **data):
    return Config(task="sft", model=model,
                  data=DataConfig(**{"source": source, "tokenizer": "bytes", "seq_len": 96, "val_fraction": 0.2,
                                     "cache_dir": str(tmp_path / "cache"), **data}),
                  optim=OptimConfig(lr=3e-3, warmup=2),
                  train=TrainConfig(steps=6, batch_size=8, log_every=2, eval_every=6, eval_batches=2, save_every=6))


@pytest.mark.parametrize("model", [GPT, LLAMA], ids=["learned", "rope_gqa"])
def test_a_packed_row_gives_each_example_its_own_loss_and_gradients(model, tmp_path):
    task = sft.SftTask(sft_cfg(tmp_path, "unused", model))
    params = nn.unbox(jax.jit(task.init)(jax.random.PRNGKey(0)))  # one program, not one per op
    rng = np.random.default_rng(0)
    lengths = (7, 12, 5)
    ex = [(rng.integers(0, 256, n + 1), (rng.random(n + 1) < 0.6)) for n in lengths]
    examples = sft.to_examples(ex)
    row = examples.rows([[0, 1, 2]], np.array([0]), 32)

    step = jax.jit(jax.value_and_grad(task.loss, has_aux=True), static_argnums=3)

    def loss_and_grads(batch):
        (loss, _), grads = step(params, jax.tree.map(jnp.asarray, batch), jax.random.PRNGKey(0), True)
        return float(loss), grads
    at = 0
    for i, n in enumerate(lengths):
        alone = examples.rows([[i]], np.array([0]), n)  # unpadded: exactly its n positions
        only_i = dict(row, weights=np.where(row["segment_ids"] == i + 1, row["weights"], 0.0))
        (l1, g1), (l2, g2) = loss_and_grads(alone), loss_and_grads(only_i)
        assert l1 > 0 and abs(l1 - l2) <= 1e-5 * abs(l1)
        for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-4, atol=1e-6)
        at += n
    # Without the segment ids the row is one long example: its later examples' losses change.
    fused = dict(row, segment_ids=np.where(row["segment_ids"] > 0, 1, 0), positions=np.arange(32)[None])
    only_2 = lambda b: dict(b, weights=np.where(row["segment_ids"] == 2, row["weights"], 0.0))  # noqa: E731
    assert abs(loss_and_grads(only_2(fused))[0] - loss_and_grads(only_2(row))[0]) > 1e-3


def test_the_loss_falls_on_the_answers_and_their_end_of_turn_only(tmp_path):
    cfg = sft_cfg(tmp_path, write_jsonl(tmp_path / "chats.jsonl", [{"messages": m} for m in CHATS]))
    data = sft.SftTask(cfg).make_data(cfg, 0, 1)
    assert "<|assistant|>" in data.files["chat_template.jinja"]  # the byte model's default template, kept
    answer = lambda *texts: tuple(x for t in texts for x in [*t.encode(), 256])  # noqa: E731
    expected = {answer(m[1]["content"]) for m in CHATS[:-1]} | {answer("hello", "ciao")}
    seen = set()
    for step in range(4):
        b = data.train(step)
        for r in range(b["inputs"].shape[0]):
            for seg in set(b["segment_ids"][r].tolist()) - {0}:
                at = b["segment_ids"][r] == seg
                assert b["positions"][r][at][0] == 0
                seen.add(tuple(b["targets"][r][at][b["weights"][r][at] > 0].tolist()))
    assert seen <= expected and len(seen) >= 10


def test_the_loss_is_token_weighted_over_the_batch(tmp_path):
    task = sft.SftTask(sft_cfg(tmp_path, "unused"))
    params = nn.unbox(jax.jit(task.init)(jax.random.PRNGKey(1)))
    rng = np.random.default_rng(1)
    ex = sft.to_examples([(rng.integers(0, 256, 9), np.r_[np.zeros(4, bool), np.ones(5, bool)]),
                          (rng.integers(0, 256, 21), np.r_[np.zeros(2, bool), np.ones(19, bool)])])
    batch = jax.tree.map(jnp.asarray, ex.rows([[0], [1]], np.array([0, 1]), 24))
    loss_sum, aux = jax.jit(task.loss, static_argnums=3)(params, batch, jax.random.PRNGKey(0), False)
    logits = jax.jit(task.model.apply)({"params": params}, batch["inputs"], positions_BT=batch["positions"],
                                       segment_ids_BT=batch["segment_ids"])
    ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["targets"][..., None], -1)[..., 0]
    w = batch["weights"]
    assert float(aux["weight"]) == 5 + 19  # the answer targets of both rows (the masks shifted by one)
    np.testing.assert_allclose(float(loss_sum / aux["weight"]), float(jnp.sum(ce * w) / jnp.sum(w)), rtol=1e-5)
    per_row_mean = float(jnp.mean(jnp.sum(ce * w, 1) / jnp.sum(w, 1)))  # what a per-row average would give
    assert abs(per_row_mean - float(loss_sum / aux["weight"])) > 1e-4


def test_exact_answers_counts_examples_whose_every_answer_token_is_right():
    seg = jnp.asarray([[1, 1, 1, 2, 2, 0], [1, 1, 2, 2, 3, 3]])
    ans = jnp.asarray([[0, 1, 1, 0, 1, 0], [1, 1, 0, 0, 1, 1]], bool)
    ok = jnp.asarray([[0, 1, 1, 1, 0, 1], [1, 1, 0, 0, 1, 0]], bool)
    out = sft.exact_answers(seg, ans, ok)
    assert (float(out["answers"]), float(out["exact"])) == (4.0, 2.0)  # row 1 seg 2 has no answer tokens


def test_long_examples_are_truncated_or_dropped_and_answerless_ones_dropped_and_counted(tmp_path, capsys):
    rows = [{"messages": m} for m in CHATS[:20]]
    rows += [{"messages": [{"role": "user", "content": "x" * 120}, {"role": "assistant", "content": "late"}]}] * 2
    rows += [{"messages": [{"role": "user", "content": "nobody answers"}]}]
    src = write_jsonl(tmp_path / "c.jsonl", rows)
    cfg = sft_cfg(tmp_path, src)
    sft.SftTask(cfg).make_data(cfg, 0, 1)
    line = capsys.readouterr().out
    assert "23 examples" in line and "2 truncated to data.seq_len + 1 = 97 tokens" in line
    assert "3 dropped with no assistant token (left)" in line  # the 2 truncated before their answer + 1
    cfg = sft_cfg(tmp_path, src, truncation="drop")
    sft.SftTask(cfg).make_data(cfg, 0, 1)
    line = capsys.readouterr().out
    assert "2 dropped as longer than 97 tokens (data.truncation=drop)" in line and "1 dropped with no" in line


def test_prompt_completion_rows_train_on_the_completion(tmp_path):
    rows = [{"prompt": f"{a} + {a} =", "completion": f" {2 * a}"} for a in range(30)]
    cfg = sft_cfg(tmp_path, write_jsonl(tmp_path / "pc.jsonl", rows), packing=False)
    b = sft.SftTask(cfg).make_data(cfg, 0, 1).train(0)
    assert b["segment_ids"].max() == 1  # one example per row without packing
    for r in range(b["inputs"].shape[0]):
        picked = b["targets"][r][b["weights"][r] > 0].tolist()
        assert picked[-1] == 256 and bytes(picked[:-1]).decode().strip().isdigit()


@pytest.mark.parametrize("rows, match", [
    ([{"messages": "hello"}] * 4, r"row 0 of data.messages_column='messages'.*list"),
    ([{"messages": [{"role": "robot", "content": "beep"}]}] * 4, r"row 0 .*'robot'.*system, user, assistant"),
    ([{"text": "no chat columns"}] * 4, r"neither a data.messages_column='messages' column .* columns: text"),
])
def test_bad_conversations_are_one_line_naming_the_culprit(tmp_path, rows, match):
    cfg = sft_cfg(tmp_path, write_jsonl(tmp_path / "bad.jsonl", rows))
    with pytest.raises(ZooDataError, match=match) as e:
        sft.SftTask(cfg).make_data(cfg, 0, 1)
    assert "\n" not in str(e.value)


def test_a_template_that_raises_is_one_line(tmp_path):
    (tmp_path / "t.jinja").write_text("{{ raise_exception('no system turns here') }}")
    cfg = sft_cfg(tmp_path, write_jsonl(tmp_path / "c.jsonl", [{"messages": m} for m in CHATS]),
                  chat_template=str(tmp_path / "t.jinja"))
    with pytest.raises(ZooDataError, match=r"t.jinja.*no system turns here"):
        sft.SftTask(cfg).make_data(cfg, 0, 1)


def test_an_sft_run_trains_and_logs_the_real_token_share(tmp_path):
    cfg = sft_cfg(tmp_path, write_jsonl(tmp_path / "c.jsonl", [{"messages": m} for m in CHATS]))
    out = run(cfg, tmp_path / "run", devices=jax.devices()[:1])
    last = out["records"][-1]
    assert 0.5 < last["real_token_frac"] < 1.0 and last["real_tokens_per_s"] < last["tokens_per_s"]
    assert 0.0 <= last["eval_exact_match"] <= 1.0 and last["loss"] < out["records"][0]["loss"]
    assert (tmp_path / "run" / "chat_template.jinja").read_text() == json.loads(json.dumps(
        out["setup"].task.make_data(cfg, 0, 1).files["chat_template.jinja"]))


def test_a_held_out_file_validates_and_its_answers_are_generated_and_scored(tmp_path, capsys):
    """data.eval_source: all of data.source trains, the held-out conversations are the validation set, and at
    each evaluation their last answers are generated and scored as zoo-eval --task generate scores them."""
    from zoo.cli import eval as zoo_eval
    src = write_jsonl(tmp_path / "train.jsonl", [{"messages": c} for c in CHATS])
    held = [[{"role": "user", "content": f"what is {a} plus 9?"}, {"role": "assistant", "content": str(a + 9)}]
            for a in range(4)]
    held.append([{"role": "user", "content": "what is 2 plus 3?"}, {"role": "assistant", "content": "5"}])  # trained
    ev = write_jsonl(tmp_path / "held.jsonl", [{"messages": c} for c in held])
    cfg = dataclasses.replace(sft_cfg(tmp_path, str(src), eval_source=str(ev)),
                              train=TrainConfig(steps=40, batch_size=8, log_every=10, eval_every=20, eval_batches=2,
                                                save_every=40))
    cfg = dataclasses.replace(cfg, optim=OptimConfig(lr=1e-2, warmup=2))
    out = run(cfg, tmp_path / "run")
    assert f"{len(CHATS)} train, {len(held)} validation" in capsys.readouterr().out
    last = out["records"][-1]
    assert {"eval_answer_exact_match", "eval_answer_contains"} <= set(last)
    qa = write_jsonl(tmp_path / "qa.jsonl", [{"messages": c[:-1], "answer": c[-1]["content"]} for c in held])
    assert zoo_eval.main([str(tmp_path / "run"), "--task", "generate", str(qa), "--json", "--max-new-tokens", "10"]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert (scored["exact_match"], scored["contains"]) == (last["eval_answer_exact_match"], last["eval_answer_contains"])
    assert last["eval_answer_exact_match"] > 0, scored["worst"]  # 2 plus 3 at least: a trained conversation
