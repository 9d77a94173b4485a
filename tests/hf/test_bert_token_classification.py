"""BertForTokenClassification, RobertaForTokenClassification and DistilBertForTokenClassification from and to
Hugging Face as zoo's bert_tokens (BertTokenClassifier: one `classifier` at every position, no pooler): logits
match transformers at every real position under padding (segments for BERT), id2label travels both ways as
the run's tag names, round trips are exact, exports load without missing or unexpected keys, and a
checkpoint without `architectures` is read as a token classifier by its weights."""

import inspect
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: HF parity tests need transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from tests.helpers import hf_runs  # noqa: E402
from zoo import hf  # noqa: E402
import zoo  # noqa: E402
from zoo.api.encoder import class_names  # noqa: E402

one_torch_thread = hf_runs.one_torch_thread  # autouse: torch on one thread
V = 101
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
# transformers class -> (its config, config fields of the odd small shapes: 3 heads of width 16, pad id)
ARCHS = {
    "BertForTokenClassification": ("BertConfig", dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                                                      intermediate_size=80, max_position_embeddings=24,
                                                      type_vocab_size=2, pad_token_id=0)),
    "RobertaForTokenClassification": ("RobertaConfig", dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                                                            intermediate_size=80, max_position_embeddings=26,
                                                            type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1,
                                                            bos_token_id=0, eos_token_id=2)),
    "DistilBertForTokenClassification": ("DistilBertConfig", dict(dim=48, n_layers=2, n_heads=3, hidden_dim=80,
                                                                  max_position_embeddings=24, pad_token_id=0)),
}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """Each token classifier over a small random config with named tags, every weight perturbed."""
    out = {}
    for i, (arch, (config_cls, fields)) in enumerate(ARCHS.items()):
        cfg = getattr(transformers, config_cls)(vocab_size=V, id2label=dict(enumerate(TAGS)),
                                                label2id={t: i for i, t in enumerate(TAGS)}, **fields)
        torch.manual_seed(i)
        model = getattr(transformers, arch)(cfg).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        d = tmp_path_factory.mktemp(arch)
        model.save_pretrained(d)
        out[arch] = (str(d), model)
    return out


def padded_inputs(arch, T=16, seed=0):
    """(ids, segments, valid): rows of T, 11 and 5 real tokens (never the pad id), segment 1 after position 6."""
    pad = ARCHS[arch][1]["pad_token_id"]
    rng = np.random.default_rng(seed)
    valid = np.arange(T)[None] < np.array([[T], [11], [5]])
    ids = np.where(valid, rng.integers(pad + 1, V, valid.shape), pad).astype(np.int32)
    segments = ((np.arange(T)[None] >= 6) & valid).astype(np.int32)
    if ARCHS[arch][1].get("type_vocab_size", 0) < 2:
        segments = np.zeros_like(segments)
    return ids, segments, valid


def hf_logits(model, ids, segments, valid):
    t = lambda x: torch.tensor(np.asarray(x, np.int64))
    kw = {"token_type_ids": t(segments)} if "token_type_ids" in inspect.signature(model.forward).parameters else {}
    with torch.no_grad():
        return model(input_ids=t(ids), attention_mask=t(valid), **kw).logits.numpy()


@pytest.mark.parametrize("arch", list(ARCHS))
def test_logits_match_transformers_and_tags_come_along(hf_dirs, tmp_path, arch):
    src, model = hf_dirs[arch]
    run = str(tmp_path / "run")
    out = hf.from_hf(src, run, verbose=False)
    cfg = out["config"]
    assert out["unused"] == [] and cfg.task == "bert_tokens" and cfg.model.num_classes == len(TAGS)
    assert cfg.data.label_names == ",".join(TAGS) and class_names(zoo.load(run)) == TAGS
    zmodel, params, _, _ = hf.from_pretrained(run)
    assert set(params) == {"bert", "token_head"}  # no pooler: the token classifier has none
    ids, segments, valid = padded_inputs(arch)
    ours = np.asarray(zmodel.apply({"params": params}, jnp.asarray(ids), jnp.asarray(segments), jnp.asarray(valid)))
    theirs = hf_logits(model, ids, segments, valid)
    assert ours.shape == theirs.shape == (3, 16, len(TAGS))
    assert np.abs(ours - theirs)[valid].max() <= 1e-4  # real positions (padding's own outputs are nobody's)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_round_trip_is_exact_and_export_loads_in_transformers(hf_dirs, tmp_path, arch):
    src, model = hf_dirs[arch]
    hf.from_hf(src, str(tmp_path / "run"), verbose=False)
    hf.to_hf(str(tmp_path / "run"), str(tmp_path / "out"), verbose=False)
    exported_cfg = json.load(open(tmp_path / "out" / "config.json"))
    assert exported_cfg["architectures"] == [arch]
    assert exported_cfg["id2label"] == {str(i): t for i, t in enumerate(TAGS)}
    assert exported_cfg["label2id"] == {t: i for i, t in enumerate(TAGS)}
    hf.from_hf(str(tmp_path / "out"), str(tmp_path / "again"), verbose=False)
    a = jax.device_get(hf.from_pretrained(str(tmp_path / "run"))[1])
    b = jax.device_get(hf.from_pretrained(str(tmp_path / "again"))[1])
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)
    exported, info = getattr(transformers, arch).from_pretrained(str(tmp_path / "out"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert exported.config.id2label == dict(enumerate(TAGS))
    ids, segments, valid = padded_inputs(arch, seed=1)
    np.testing.assert_array_equal(hf_logits(exported.eval(), ids, segments, valid), hf_logits(model, ids, segments,
                                                                                               valid))


@pytest.mark.parametrize("arch", list(ARCHS))
def test_a_checkpoint_without_architectures_is_read_by_its_weights(hf_dirs, tmp_path, arch):
    src, _ = hf_dirs[arch]
    d = tmp_path / "bare"
    d.mkdir()
    config = json.load(open(os.path.join(src, "config.json")))
    del config["architectures"]
    (d / "config.json").write_text(json.dumps(config))
    os.symlink(os.path.join(src, "model.safetensors"), d / "model.safetensors")
    assert hf.from_hf(str(d), str(tmp_path / "run"), verbose=False)["config"].task == "bert_tokens"
