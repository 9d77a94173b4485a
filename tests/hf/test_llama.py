"""Llama, Qwen2 and Mistral from and to Hugging Face, beside the parity every row of tests/hf/parity_table.py takes
(tests/hf/test_parity_decoders.py: logits, greedy continuations, export and back): a Llama-style tokenizer.json
(and chat template) travels both ways and frames plain text as transformers' tokenizer does; a zoo-trained Llama
exports; the older rope fields convert; configs no architecture holds are refused in one line.
"""

import dataclasses
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: HF parity tests need transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from tests.helpers import hf_runs, tiny_configs  # noqa: E402
from tests.helpers.hf_runs import hf_refs_fixture  # noqa: F401,E402  (the session's references)
from tests.helpers.runs import run  # noqa: E402
from tests.hf.parity_table import BOS, CHAT, EOS, LLAMA3_ROPE, byte_level_tokenizer  # noqa: E402
from zoo import hf, tasks  # noqa: E402
from zoo.configuration import Config, DataConfig  # noqa: E402
from zoo.data.hf_tokenizers import Pretrained  # noqa: E402
from zoo.data.tokenizers import get_tokenizer  # noqa: E402
from zoo.errors import ConversionError  # noqa: E402
from zoo.hf.convert import export_converter  # noqa: E402
from zoo.models.gpt import GptConfig  # noqa: E402
from zoo.training import checkpoint  # noqa: E402
from zoo.training import runs as run_reader  # noqa: E402

one_torch_thread = hf_runs.one_torch_thread  # autouse: torch on one thread
hf_logits = hf_runs.hf_logits
edited = hf_runs.edited
TEXTS = ["The if statement is used for conditional execution.", "  spaces\tand\nnewlines  ",
         "Unicode: naïve café 😀 3.14159", "I'm sure they'll've 12345678 items"]


def test_plain_text_starts_with_the_bos_as_transformers_tokenizer_puts_it(hf_refs):
    """The Llama 3-style tokenizer puts <|begin_of_text|> before a text: zoo's plain-text ids are
    `tokenizer(text)`'s, so greedy `generate` continues what transformers' `generate` continues, and `logprobs`
    scores each token as transformers does after that BOS."""
    import zoo
    from zoo.api import decoder
    from zoo.data.tokenizers import encode_text
    src, torch_model = hf_refs.reference("llama")
    theirs = transformers.AutoTokenizer.from_pretrained(src)
    lm = zoo.load(hf_refs.converted("llama").run)
    for text in TEXTS:
        assert encode_text(lm.tokenizer, text) == theirs(text)["input_ids"] and theirs(text)["input_ids"][0] == 0
    prompt = "The if statement"
    ids = theirs(prompt, return_tensors="pt")
    with torch.no_grad():
        out = torch_model.generate(**ids, max_new_tokens=8, do_sample=False, eos_token_id=1, pad_token_id=1)
    want = out[0, ids["input_ids"].shape[1]:].tolist()
    assert decoder.prompt_tokens(lm, [prompt]) == [ids["input_ids"][0].tolist()]  # what zoo-serve encodes too
    assert lm.generate(prompt, max_new_tokens=8) == theirs.decode(want, skip_special_tokens=True)
    assert decoder.generate_ids(lm, [lm.tokenize(prompt)], max_new_tokens=8)[0] != want  # the BOS changes it
    text_ids = theirs(TEXTS[0])["input_ids"]
    logp = torch.log_softmax(torch.tensor(hf_logits(torch_model, [text_ids])[0]), -1).numpy()
    np.testing.assert_allclose(lm.logprobs(TEXTS[0]), logp[np.arange(len(text_ids) - 1), text_ids[1:]], atol=1e-4)
    # zoo-serve's echo scoring of that prompt: the BOS conditions the rest and has no number itself (not BOS BOS).
    from zoo.engine.batching import Engine
    lp, _, _ = Engine(lm, slots=1, max_len=64).score_program([text_ids], top=False)()[0]
    assert np.isnan(lp[0]) and len(lp) == len(text_ids)
    np.testing.assert_allclose(lp[1:], logp[np.arange(len(text_ids) - 1), text_ids[1:]], atol=1e-4)


def test_the_checkpoint_tokenizer_and_chat_template_travel_both_ways(hf_refs, tmp_path):
    src, run_dir = hf_refs.directory("llama"), hf_refs.converted("llama").run
    theirs = transformers.AutoTokenizer.from_pretrained(src)
    _, _, ours, cfg = run_reader.load_run(run_dir)
    assert sorted(os.listdir(cfg.data.tokenizer)) == ["chat_template.jinja", "tokenizer.json", "tokenizer_config.json"]
    assert isinstance(ours, Pretrained) and (ours.eot_token, ours.bos_token) == (1, 0)
    for text in TEXTS:
        assert ours.encode(text) == theirs(text, add_special_tokens=False).input_ids  # no BOS: zoo frames rows
        assert ours.decode(ours.encode(text)) == text
    hf.to_hf(run_dir, str(tmp_path / "out"), verbose=False)
    assert {"chat_template.jinja", "tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(tmp_path / "out"))
    exported = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    assert exported.chat_template == CHAT
    assert exported(TEXTS[0]).input_ids == [0, *ours.encode(TEXTS[0])]
    hf_cfg = json.load(open(tmp_path / "out" / "config.json"))
    assert (hf_cfg["bos_token_id"], hf_cfg["eos_token_id"]) == (0, 1)


def test_a_byte_level_tokenizer_beside_vocab_json_and_merges_txt_keeps_its_own_split(tmp_path):
    """Qwen2 ships vocab.json + merges.txt beside a tokenizer.json whose split regex is not GPT-2's: the
    tokenizer.json decides, not a GPT-2 BPE rebuilt from those files with GPT-2's regex."""
    tok = byte_level_tokenizer()
    tok.save(str(tmp_path / "tokenizer.json"))
    tok.model.save(str(tmp_path))  # vocab.json + merges.txt
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS, "bos_token": BOS}))
    ours = get_tokenizer(str(tmp_path))
    assert isinstance(ours, Pretrained)
    for text in TEXTS:
        assert ours.encode(text) == tok.encode(text, add_special_tokens=False).ids
        assert ours.decode(ours.encode(text)) == text


def test_a_metaspace_tokenizer_loads_and_round_trips(tmp_path):
    """Llama 2 / Mistral style: SentencePiece-like BPE, '▁' for spaces, prepended to the first word."""
    from pydoc_data.topics import topics
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.train_from_iterator(list(topics.values())[:30], trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"]))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                         unk_token="<unk>").save_pretrained(str(tmp_path))
    ours, theirs = get_tokenizer(str(tmp_path)), transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert isinstance(ours, Pretrained) and (ours.eot_token, ours.bos_token) == (2, 1)
    for text in ["The if statement is used for conditional execution.", "Hello world, this is a test."]:
        ids = ours.encode(text)
        assert ids == theirs(text, add_special_tokens=False).input_ids and len(ids) < len(text)
        assert ours.decode(ids) == text


def llama_model(**switches) -> GptConfig:
    """A width-32 Llama (2 key/value heads for 4 query heads, no biases, untied) with `switches` changed."""
    return GptConfig(**{**dict(vocab_size=264, max_len=64, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2,
                               d_ff=64, dropout=0.0, positions="rope", norm="rmsnorm", mlp="swiglu", qkv_bias=False,
                               out_bias=False, mlp_bias=False, tie_embeddings=False), **switches})


def test_a_zoo_trained_llama_exports_to_transformers(cache_dir, tmp_path):
    cfg = tiny_configs.gpt_lm(cache_dir)
    cfg = dataclasses.replace(cfg, model=llama_model(), train=dataclasses.replace(cfg.train, steps=2, save_every=2))
    run(cfg, tmp_path / "run")
    hf.to_hf(str(tmp_path / "run"), str(tmp_path / "out"), verbose=False)
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    assert type(exported).__name__ == "LlamaForCausalLM"
    zmodel, params, tok, _ = run_reader.load_run(str(tmp_path / "run"))
    ids = np.random.default_rng(1).integers(0, 257, (2, 12))
    assert np.abs(np.asarray(zmodel.apply({"params": params}, jnp.asarray(ids))) - hf_logits(exported, ids)).max() \
        <= 1e-4
    hf_cfg = json.load(open(tmp_path / "out" / "config.json"))
    assert (hf_cfg["bos_token_id"], hf_cfg["eos_token_id"]) == (256, 256)  # bytes' end-of-text
    assert transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))(TEXTS[2]).input_ids == tok.encode(TEXTS[2])
    assert hf.from_hf(str(tmp_path / "out"), str(tmp_path / "again"), verbose=False)["config"].model == cfg.model


@pytest.mark.parametrize("switches,arch", [
    (dict(positions="learned", norm="layernorm", mlp="gelu", num_kv_heads=0, qkv_bias=True, out_bias=True,
          mlp_bias=True, tie_embeddings=True), "GPT2LMHeadModel"),
    ({}, "LlamaForCausalLM"),
    (dict(qkv_bias=True, out_bias=True, mlp_bias=True, rope_scaling="llama3"), "LlamaForCausalLM"),
    (dict(qkv_bias=True, tie_embeddings=True), "Qwen2ForCausalLM"),
    (dict(sliding_window=8), "MistralForCausalLM")])
def test_export_picks_the_architecture_the_switches_describe(switches, arch):
    assert export_converter(llama_model(**switches)).ARCHITECTURES[0] == arch


@pytest.mark.parametrize("switches", [dict(norm="layernorm"), dict(mlp="gelu"), dict(sliding_window=8, qkv_bias=True),
                                      dict(qkv_bias=False, out_bias=True),
                                      dict(positions="learned", norm="layernorm", mlp="gelu", qkv_bias=True,
                                           out_bias=True, mlp_bias=True, tie_embeddings=True)])  # GPT-2 with GQA
def test_a_decoder_no_architecture_holds_is_refused_in_one_line(switches, tmp_path):
    cfg = Config(task="gpt_lm", model=llama_model(**switches), data=DataConfig(tokenizer="bytes", seq_len=16))
    shapes = nn.unbox(jax.eval_shape(tasks.build(cfg).init, jax.random.PRNGKey(0)))
    checkpoint.save_weights(str(tmp_path / "run"), jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes), cfg)
    with pytest.raises(ConversionError, match=r"this gpt model has no Hugging Face equivalent; it exports as GPT-2: "
                                              r".* or as Llama: positions=rope") as e:
        hf.to_hf(str(tmp_path / "run"), str(tmp_path / "out"), verbose=False)
    assert "\n" not in str(e.value)
    assert not os.path.exists(tmp_path / "out")


def test_the_older_rope_theta_and_rope_scaling_fields_convert_as_rope_parameters(hf_refs, tmp_path):
    src = hf_refs.directory("llama3_bias")
    old = {k: v for k, v in LLAMA3_ROPE.items() if k not in ("rope_type", "rope_theta")}
    report = hf.from_hf(edited(src, tmp_path / "old", rope_parameters=None, rope_theta=500000.0,
                               rope_scaling={"type": "llama3", **old}), str(tmp_path / "run"), verbose=False)
    assert report["config"].model == hf_refs.converted("llama3_bias").config.model


@pytest.mark.parametrize("name,fields,message", [
    ("llama", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}),
     r"^Llama rope type 'yarn' is not supported; supported: default, llama3$"),
    ("llama", dict(hidden_act="gelu"), r"^Llama hidden_act='gelu' is not supported"),
    ("mistral", dict(partial_rotary_factor=0.5), r"^Mistral partial_rotary_factor=0.5 is not supported"),
    ("qwen2", dict(use_sliding_window=True, layer_types=None), r"^Qwen2 use_sliding_window=true is not supported")])
def test_what_zoo_cannot_hold_is_refused_in_one_line(hf_refs, tmp_path, name, fields, message):
    with pytest.raises(ConversionError, match=message) as e:
        hf.from_hf(edited(hf_refs.directory(name), tmp_path / "bad", **fields), str(tmp_path / "run"), verbose=False)
    assert "\n" not in str(e.value)
    assert not os.path.exists(tmp_path / "run")
