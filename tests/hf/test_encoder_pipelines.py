"""zoo.load(dir).classify / .tag / .fill_mask on a Hugging Face checkpoint answer as transformers' pipelines on
the same directory, for BERT, DistilBERT, RoBERTa (byte-level BPE with vocab.json + merges.txt, as the hub's)
and XLM-R (SentencePiece unigram): the tokenizer's own specials frame the rows (<s> a </s></s> b </s> for
RoBERTa's pairs), fill-mask takes the softmax over the whole vocabulary (specials included), tag reads each
word's first token of the text tokenized whole; a token id outside the embedding table is refused in one line."""

import json
import os
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: HF parity tests need transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from tests.helpers.hf_runs import one_torch_thread  # noqa: F401,E402  (autouse: torch on one thread)
import zoo  # noqa: E402
from zoo.api import encoder  # noqa: E402
from zoo.errors import ZooDataError  # noqa: E402

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
TEXTS = ["The class statement defines a new type.", "Each name is bound in the local namespace",
         "lambda x: x + 1 returns its argument plus one"]
PAIRS = [("The if statement is used for conditional execution.", "It selects exactly one of the suites"),
         ("A function definition", "defines a user-defined function object")]
# family -> (config class, model class prefix, config fields beside the shared small shape)
ROBERTA = dict(type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2)
HEADS = ("ForSequenceClassification", "ForTokenClassification", "ForMaskedLM")
ARCHS = {"distilbert": ("DistilBertConfig", "DistilBert", dict(pad_token_id=0)),
         "roberta": ("RobertaConfig", "Roberta", ROBERTA), "xlmr": ("XLMRobertaConfig", "XLMRoberta", ROBERTA)}


def corpus():
    from pydoc_data.topics import topics
    return [*list(topics.values())[:12], *TEXTS, *(a + " " + b for a, b in PAIRS)]


def tokenizer(family: str, out: str):
    """A small tokenizer of the family's kind, trained on pydoc topics, saved to `out`."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers
    texts = corpus()
    if family in ("bert", "distilbert"):
        words = list(dict.fromkeys(w for t in texts[::-1] for w in re.findall(r"\w+|[^\w\s]", t.lower())))[:250]
        vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])}
        tok = getattr(transformers, "BertTokenizer" if family == "bert" else "DistilBertTokenizer")(vocab=vocab)
    elif family == "roberta":
        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.train_from_iterator(texts, trainers.BpeTrainer(
            vocab_size=1000, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        model = json.loads(bpe.to_str())["model"]
        vocab, merges = {**model["vocab"], "<mask>": len(model["vocab"])}, [tuple(m) for m in model["merges"]]
        tok = transformers.RobertaTokenizer(vocab=vocab, merges=merges, mask_token=AddedToken("<mask>", lstrip=True))
        # The hub's layout: vocab.json + merges.txt beside tokenizer.json (zoo reads these through tiktoken).
        with open(os.path.join(out, "vocab.json"), "w") as f:
            json.dump(vocab, f)
        with open(os.path.join(out, "merges.txt"), "w") as f:
            f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    else:
        uni = Tokenizer(models.Unigram())
        uni.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace()])
        uni.train_from_iterator(texts, trainers.UnigramTrainer(vocab_size=300, unk_token="<unk>",
                                                               special_tokens=["<s>", "<pad>", "</s>", "<unk>"]))
        vocab = [tuple(v) for v in json.loads(uni.to_str())["model"]["vocab"]]
        tok = transformers.XLMRobertaTokenizer(vocab=vocab, mask_token=AddedToken("<mask>", lstrip=True))
    tok.save_pretrained(out)
    return tok


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """family -> (directory, transformers tokenizer) of each tokenizer kind: WordPiece (BERT's and DistilBERT's),
    RoBERTa's byte-level BPE, XLM-R's unigram."""
    out = {}
    for family in ("bert", "roberta", "xlmr"):
        d = str(tmp_path_factory.mktemp(f"{family}_tok"))
        out[family] = (d, tokenizer(family, d))
    out["distilbert"] = out["bert"]
    return out


@pytest.fixture(scope="module")
def checkpoint(tokenizers, tmp_path_factory):
    """(family, head) -> a directory holding that head over a tiny random config (every weight perturbed) and the
    family's tokenizer, built on first use."""
    made = {}

    def make(family, head):
        if (family, head) in made:
            return made[family, head]
        tok_dir, tok = tokenizers[family]
        config_cls, prefix, fields = ARCHS[family]
        shape = dict(dim=32, n_layers=1, n_heads=2, hidden_dim=48, max_position_embeddings=64) \
            if family == "distilbert" else \
            dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=48,
                 max_position_embeddings=64 + fields["pad_token_id"] + 1, layer_norm_eps=1e-5)
        cfg = getattr(transformers, config_cls)(vocab_size=len(tok), id2label=dict(enumerate(TAGS)),
                                                label2id={t: i for i, t in enumerate(TAGS)}, **shape, **fields)
        torch.manual_seed(sorted(ARCHS).index(family) * 3 + HEADS.index(head))  # whatever order tests run in
        model = getattr(transformers, prefix + head)(cfg).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.3 * torch.randn_like(p))
            if head == "ForTokenClassification":  # tags that differ from word to word
                model.classifier.weight.normal_(0, 1)
            if head == "ForMaskedLM":  # the separator among the best: the pipeline ranks specials too
                model.get_output_embeddings().bias[tok.sep_token_id] += 8
        d = str(tmp_path_factory.mktemp(f"{family}_{head}"))
        model.save_pretrained(d)
        for f in os.listdir(tok_dir):
            os.symlink(os.path.join(tok_dir, f), os.path.join(d, f))
        made[family, head] = d
        return d
    return make


def pipeline(task, d):
    return transformers.pipeline(task, model=d, device="cpu")


@pytest.mark.parametrize("family", ["bert", "roberta", "xlmr"])
def test_rows_are_framed_as_the_hugging_face_tokenizer_frames_them(tokenizers, family):
    """Classify's rows (pairs too), fill-mask's (the mask as the tokenizer reads it: RoBERTa's <mask> takes the
    space on its left) and tag's are the ids transformers' tokenizer gives; no model needed."""
    from zoo.data.tokenizers import get_tokenizer
    from zoo.tasks import classify, mlm
    d, theirs = tokenizers[family]
    ours = get_tokenizer(d)
    sp = mlm.bert_specials(ours)
    assert (sp.cls, sp.sep, sp.mask, sp.pad) == (theirs.cls_token_id, theirs.sep_token_id, theirs.mask_token_id,
                                                 theirs.pad_token_id)
    assert sp.mask_text == theirs.mask_token and sp.pair_seps == (1 if family == "bert" else 2)
    assert not sp.is_special(np.asarray([theirs.convert_tokens_to_ids(t) for t in theirs.tokenize(TEXTS[0])])).any()
    for text in TEXTS:
        assert classify.frame(ours.encode(text), None, sp)[0] == theirs(text).input_ids
        assert [sp.cls, *ours.encode_with_offsets(text)[0], sp.sep] == theirs(text).input_ids
    for a, b in PAIRS:
        assert classify.frame(ours.encode(a), ours.encode(b), sp)[0] == theirs(a, b).input_ids
    for text in (f"The class {sp.mask_text} defines a new type.", f"Each name is {sp.mask_text} in the local "
                 f"{sp.mask_text}", f"{sp.mask_text}is bound{sp.mask_text}"):
        assert mlm.encode_masked(text, ours, sp) == theirs(text).input_ids


def test_classify_matches_the_pipeline(checkpoint):
    """RoBERTa's classifier (answered NaN for every class when zoo invented [CLS] ids past its rows), pairs too."""
    d = checkpoint("roberta", "ForSequenceClassification")
    lm = zoo.load(d)
    ours = lm.classify(TEXTS[:2]) + lm.classify([a for a, _ in PAIRS], [b for _, b in PAIRS])
    theirs = pipeline("text-classification", d)([*TEXTS[:2], *({"text": a, "text_pair": b} for a, b in PAIRS)],
                                                top_k=None)
    for o, t in zip(ours, theirs, strict=True):
        assert max(abs(o["probs"][x["label"]] - x["score"]) for x in t) <= 1e-5
        assert o["label"] == max(t, key=lambda x: x["score"])["label"]


@pytest.mark.parametrize("family", ["roberta", "xlmr"])
def test_tag_matches_the_pipeline(checkpoint, family):
    """Each word's tag is the pipeline's at the word's first token (zoo tagged every word O before)."""
    d = checkpoint(family, "ForTokenClassification")
    ours = zoo.load(d).tag(TEXTS)
    tagged = pipeline("token-classification", d)(TEXTS, aggregation_strategy="none", ignore_labels=[])
    seen = set()
    for text, o, t in zip(TEXTS, ours, tagged, strict=True):
        assert [w for w, _ in o] == text.split()
        for (word, tag), m in zip(o, re.finditer(r"\S+", text)):
            first = next(x for x in t if x["end"] > m.start() and x["start"] < m.end())
            assert tag == first["entity"], word
            seen.add(tag)
    assert len(seen) > 1  # not every word O


@pytest.mark.parametrize("family", ["distilbert", "roberta"])
def test_fill_mask_matches_the_pipeline(checkpoint, family):
    """The softmax over the whole vocabulary and its top k, specials included, their text as the pipeline's."""
    d = checkpoint(family, "ForMaskedLM")
    lm = zoo.load(d)
    fill = pipeline("fill-mask", d)
    mask = fill.tokenizer.mask_token
    texts = [f"The class {mask} defines a new type.", f"Each name is {mask} in the local {mask}"]
    ours, ids = lm.fill_mask(texts, top_k=6), encoder.fill_mask_ids(lm, texts, 6)
    for text, o, i in zip(texts, ours, ids, strict=True):
        t = fill(text, top_k=6)
        t = [t] if isinstance(t[0], dict) else t  # one list per mask
        assert len(o) == len(t) == text.count(mask)
        for om, im, tm in zip(o, i, t):
            assert [x for x, _ in im] == [x["token"] for x in tm]
            assert [x for x, _ in om] == [x["token_str"] for x in tm]
            assert max(abs(p - x["score"]) for (_, p), x in zip(om, tm)) <= 1e-5
    assert any(x == fill.tokenizer.sep_token_id for f in ids for m in f for x, _ in m)


def test_an_id_outside_the_embedding_table_is_refused_in_one_line(checkpoint, tmp_path):
    """A RoBERTa whose rows end before its tokenizer's <mask>: refused before any lookup (a gather there is NaN)."""
    src = checkpoint("roberta", "ForMaskedLM")
    for f in os.listdir(src):
        if f not in ("config.json", "model.safetensors"):
            os.symlink(os.path.join(src, f), tmp_path / f)
    config = transformers.AutoConfig.from_pretrained(src)
    mask_id = config.vocab_size - 1
    config.vocab_size = mask_id
    transformers.RobertaForMaskedLM(config).save_pretrained(tmp_path)
    with pytest.raises(ZooDataError, match=rf"^text 0: token id {mask_id} is outside the model's embedding table "
                                           rf"of model.vocab_size={mask_id} rows; tokenizer '.*' does not fit this "
                                           rf"model$"):
        zoo.load(str(tmp_path)).fill_mask("The class <mask> defines a new type.")
