"""GPT-2 from and to Hugging Face, beside the parity of its row in tests/hf/parity_table.py (logits, greedy
continuation, export and back in tests/hf/test_parity_decoders.py): zoo reads a GPT-2 checkpoint directory in
memory and continues it as transformers does; its byte-level BPE tokenizes as transformers'; an unsupported
architecture and a missing key are refused."""

import json
import os

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: HF parity tests need transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from tests.helpers.hf_runs import hf_refs_fixture, one_torch_thread  # noqa: F401,E402  (one_torch_thread: autouse)
from zoo import hf  # noqa: E402
from zoo.errors import ConversionError  # noqa: E402
from zoo.infer.sample import generate  # noqa: E402


def test_greedy_generation_straight_from_the_hf_directory_equals_transformers_generate(hf_refs):
    src, model = hf_refs.reference("gpt2")
    zmodel, params, _, _ = hf.from_pretrained(src)  # converted in memory, nothing written
    prompt = [5, 17, 42, 8]
    ours = generate(zmodel, params, prompt, 20, temperature=0.0)[0]
    with torch.no_grad():
        theirs = model.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, use_cache=True,
                                pad_token_id=98, eos_token_id=None)[0, len(prompt):].tolist()
    assert ours == theirs


def test_byte_level_bpe_from_vocab_and_merges_equals_transformers(tmp_path):
    from pydoc_data.topics import topics
    from tokenizers import ByteLevelBPETokenizer
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(list(topics.values())[:30], vocab_size=600, special_tokens=["<|endoftext|>"])
    bpe.save_model(str(tmp_path))
    from zoo.data.tokenizers import get_tokenizer
    ours = get_tokenizer(str(tmp_path))
    theirs = transformers.GPT2TokenizerFast(vocab=str(tmp_path / "vocab.json"),
                                            merges=str(tmp_path / "merges.txt"))
    for text in ["The if statement is used for conditional execution.", "  spaces\tand\nnewlines  ",
                 "Unicode: naïve café — ünïcödé 😀", topics["if"][:500]]:
        assert ours.encode(text) == theirs.encode(text)
        assert ours.decode(ours.encode(text)) == text
    assert ours.eot_token == json.load(open(tmp_path / "vocab.json"))["<|endoftext|>"]


def test_unsupported_architecture_and_missing_keys(tmp_path, hf_refs):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "config.json").write_text(json.dumps({"model_type": "falcon", "architectures": ["FalconForCausalLM"]}))
    with pytest.raises(ConversionError, match=r"unsupported architecture FalconForCausalLM .*supported: GPT2LMHeadModel"):
        hf.from_hf(str(tmp_path / "x"), str(tmp_path / "run"), verbose=False)
    from safetensors.numpy import load_file, save_file
    src = hf_refs.directory("gpt2")
    broken = tmp_path / "broken"
    broken.mkdir()
    tensors = load_file(os.path.join(src, "model.safetensors"))
    del tensors["transformer.h.1.mlp.c_fc.bias"]
    save_file(tensors, str(broken / "model.safetensors"))
    (broken / "config.json").write_text(open(os.path.join(src, "config.json")).read())
    with pytest.raises(ConversionError, match="missing key 'h.1.mlp.c_fc.bias'"):
        hf.from_hf(str(broken), str(tmp_path / "run2"), verbose=False)
    assert not os.path.exists(tmp_path / "run2" / "checkpoints")


@pytest.mark.parametrize("specials", [["<|endoftext|>"], ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]],
                         ids=["gpt2 files", "bart files"])
def test_special_token_text_in_a_document_reads_as_text_as_transformers_reads_it_with_split_special_tokens(
        tmp_path, specials):
    """The import direction of zoo's rule (a special's text inside a document is text, never the special): a
    GPT-2 or BART vocab.json + merges.txt gives zoo's ids equal to transformers' with split_special_tokens=True;
    transformers' default (False) maps the text to the special ids instead, so the two differ there."""
    from pydoc_data.topics import topics
    from tokenizers import ByteLevelBPETokenizer
    from zoo.data.tokenizers import get_tokenizer
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(list(topics.values())[:30], vocab_size=600, special_tokens=specials)
    bpe.save_model(str(tmp_path))
    ours = get_tokenizer(str(tmp_path))
    cls = transformers.GPT2TokenizerFast if len(specials) == 1 else transformers.BartTokenizerFast
    files = dict(vocab=str(tmp_path / "vocab.json"), merges=str(tmp_path / "merges.txt"))
    text = "a <|endoftext|> b [CLS] c <s>d</s> <pad> <mask> <unk> <|im_start|>"
    split = cls(**files, split_special_tokens=True)(text, add_special_tokens=False).input_ids
    default = cls(**files)(text, add_special_tokens=False).input_ids
    assert ours.encode(text) == split and ours.decode(split) == text
    assert default != split  # what split_special_tokens changes: the specials' ids in place of their text
