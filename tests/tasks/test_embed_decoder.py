"""task=embed on a decoder (zoo.tasks.embed_decoder): the loss and its gradient equal sentence-transformers'
MultipleNegativesRankingLoss over a Llama's last-token states in transformers; a fine-tune keeps the checkpoint's
pooling and `zoo.load(run).embed` pools as it trained; a pooling the family does not train is refused in one line.
8 devices = 1, resume and LoRA: tests/tasks/test_embed_task.py, on an encoder and on this decoder."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import zoo
from conftest import replace
from tests.helpers import hf_runs, tiny_lms
from tests.helpers.runs import losses, write_jsonl
from tests.helpers.tiny_configs import bert as bert_cfg
from tests.helpers.tiny_configs import llama_lm
from zoo import hf, tasks
from zoo.errors import ConfigError
from zoo.tasks import embed as embed_task

one_torch_thread = hf_runs.one_torch_thread  # autouse

ANCHORS = ["how do I open a file", "a loop", "x", "what is a list comprehension?", "import", "the with statement"]
POSITIVES = ["open() returns a file object", "for and while repeat", "the letter x", "[f(x) for x in xs]",
             "import finds and loads modules", "with calls __enter__ and __exit__"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(the tiny Llama's Hugging Face directory, a zoo run converted from it)."""
    base = tmp_path_factory.mktemp("llama_embed")
    tiny_lms.llama(base / "hf")
    hf.from_hf(str(base / "hf"), str(base / "run"), verbose=False)
    return str(base / "hf"), str(base / "run")


@pytest.mark.parametrize("symmetric", [False, True])
def test_loss_and_gradient_equal_sentence_transformers_on_a_llamas_last_tokens(llama, symmetric):
    """The task's loss on the converted Llama (no dropout) and the gradient of its token embedding, against
    transformers' LlamaModel on the same right-padded rows, each text's state at its last token, and
    sentence-transformers' MNRL module on those states."""
    from sentence_transformers import losses as st_losses
    lm = zoo.load(llama[1])
    cfg = dataclasses.replace(lm.config, task="embed", init_from=llama[1],
                              embed=dataclasses.replace(lm.config.embed, symmetric=symmetric))
    task = tasks.build(cfg)
    assert type(task).__name__ == "DecoderEmbedTask" and task.pooling.mode == "last"
    framed = [task.frame(lm.tokenizer, None, texts, 24) for texts in (ANCHORS, POSITIVES)]
    ids_NKT, lengths_NK = np.stack([f[0] for f in framed], 1), np.stack([f[1] for f in framed], 1)
    assert ids_NKT[2, 0, 0] == lm.tokenizer.encode("x")[0] and lengths_NK[2, 0] == 1  # no token added
    batch = embed_task.Pairs(ids_NKT, lengths_NK).rows(np.arange(len(ANCHORS)))
    (loss_sum, aux), grads = jax.value_and_grad(task.loss, has_aux=True)(lm.params, batch, jax.random.PRNGKey(0),
                                                                          False)
    loss, g_wte = float(loss_sum / aux["weight"]), np.asarray(grads["wte"]["embedding"]) / len(ANCHORS)

    import transformers
    model = transformers.LlamaForCausalLM.from_pretrained(llama[0]).model.eval()
    states = []
    for k in range(2):
        ids = torch.tensor(ids_NKT[:, k].astype(np.int64))
        mask = torch.tensor(np.arange(ids.shape[1])[None] < lengths_NK[:, k, None]).long()
        h = model(input_ids=ids, attention_mask=mask).last_hidden_state
        states.append(h[torch.arange(len(ids)), torch.tensor(lengths_NK[:, k] - 1)])
    cls = st_losses.MultipleNegativesSymmetricRankingLoss if symmetric else st_losses.MultipleNegativesRankingLoss
    theirs = cls(model=None, scale=20.0).compute_loss_from_embeddings(states, None)
    theirs.backward()
    g_theirs = model.embed_tokens.weight.grad.numpy()
    assert abs(loss - theirs.item()) <= 1e-5 and loss > 0.05, (loss, theirs.item())
    # within 1e-5 of the largest entry (this Llama's initializer_range 0.2 gives entries near 1)
    np.testing.assert_allclose(g_wte, g_theirs, atol=1e-5 * np.abs(g_theirs).max(), rtol=0)
    assert np.abs(g_theirs).max() > 1e-3  # a gradient that can be wrong
    assert "lm_head" in grads and not any(np.asarray(g).any() for g in jax.tree.leaves(grads["lm_head"]))  # unread


def test_a_fine_tune_keeps_the_checkpoints_pooling_and_embeds_as_it_trained(llama, tmp_path):
    """The converted Llama given sentence-transformers files (last token, Normalize): the run keeps them, its loss
    falls, and zoo.load(run).embed gives the task's own unit vectors."""
    (tmp_path / "with_st").mkdir()  # the run, seen through a folder with the files beside it
    for name in os.listdir(llama[1]):
        os.symlink(os.path.join(llama[1], name), tmp_path / "with_st" / name)
    embed_task.write_st_files(str(tmp_path / "with_st"), embed_task.Pooling("last", True, 32), 32)
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"query": a, "document": p} for a, p in zip(ANCHORS, POSITIVES)] * 8)
    work = str(tmp_path / "run")
    out = zoo.train(init_from=str(tmp_path / "with_st"), workdir=work, quiet=True, devices=jax.devices()[:1],
                    overrides=["task=embed", f"data.source={pairs}", "data.seq_len=32", "data.val_fraction=0.1",
                               "train.steps=8", "train.batch_size=6", "optim.lr=3e-3", "optim.warmup=0",
                               "train.eval_every=0", "train.save_every=8", "train.log_every=1"])
    assert out.config.task == "embed" and out.config.model.family == "gpt"
    pooling = json.load(open(os.path.join(work, "1_Pooling", "config.json")))
    assert pooling["pooling_mode_lasttoken"] is True and not pooling["pooling_mode_mean_tokens"]
    assert os.path.isdir(os.path.join(work, "2_Normalize"))
    steps = losses(work)
    assert steps[8] < steps[1] - 0.05, steps
    tuned = zoo.load(work)
    assert tuned.offers()[0] == "embed"
    vecs = tuned.embed(ANCHORS)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=-1), 1.0, atol=1e-5)
    task = tasks.build(tuned.config)
    ids, lengths = task.frame(tuned.tokenizer, None, ANCHORS, 32)
    h = task.hidden_states(tuned.params, jnp.asarray(ids), jnp.asarray(np.arange(32) < lengths[:, None]), False,
                           jax.random.PRNGKey(0))
    last = np.asarray(h)[np.arange(len(ids)), lengths - 1]
    np.testing.assert_allclose(vecs, last / np.linalg.norm(last, axis=-1, keepdims=True), atol=1e-5)


def test_a_pooling_the_family_does_not_train_is_refused_in_one_line(tmp_path):
    cfg = dataclasses.replace(llama_lm(str(tmp_path)), task="embed")
    assert replace(cfg, embed=dict(pooling="mean")).embed.pooling == "mean"
    with pytest.raises(ConfigError, match=r"embed.pooling='cls' does not pool a gpt model; choose one of last, mean, "
                                          r"max, mean_sqrt_len$"):
        replace(cfg, embed=dict(pooling="cls"))
    with pytest.raises(ConfigError, match=r"embed.pooling='last' does not pool a bert model; choose one of mean, cls, "
                                          r"max, mean_sqrt_len$"):
        replace(bert_cfg("embed", str(tmp_path)), embed=dict(pooling="last"))
