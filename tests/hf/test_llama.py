"""Llama, Qwen2 and Mistral from and to Hugging Face: small random transformers models convert to zoo
runs whose logits and greedy continuations equal transformers'; `to-hf` of each loads back in
transformers as the same architecture with equal logits; a Llama-style tokenizer.json (and chat
template) travels both ways; a zoo-trained Llama exports; configs no architecture holds are refused.
"""

import dataclasses
import json
import os
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: HF parity tests need transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from tests.helpers import hf_runs, tiny_configs  # noqa: E402
from tests.helpers.hf_runs import convert_all  # noqa: E402
from tests.helpers.runs import run  # noqa: E402
from zoo import hf, tasks  # noqa: E402
from zoo.configuration import Config, DataConfig  # noqa: E402
from zoo.data.hf_tokenizers import Pretrained  # noqa: E402
from zoo.data.tokenizers import get_tokenizer  # noqa: E402
from zoo.errors import ConversionError  # noqa: E402
from zoo.hf.convert import export_converter  # noqa: E402
from zoo.infer.sample import generate  # noqa: E402
from zoo.models.gpt import GptConfig  # noqa: E402
from zoo.training import checkpoint  # noqa: E402
from zoo.training import runs as run_reader  # noqa: E402

one_torch_thread = hf_runs.one_torch_thread  # autouse: torch on one thread
hf_logits = hf_runs.hf_logits
V = 300  # the test tokenizer's vocabulary: 256 bytes, 2 specials, 42 merges
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"  # ids 0 and 1
# initializer_range 0.2, not 0.02: attention then is far from uniform, so a rope or window applied wrongly
# moves the logits by 1e-3 to 5, well past the 1e-4 the tests allow (zoo matches to ~5e-6).
SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1, initializer_range=0.2,
             attn_implementation="eager")
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}  # head dim 8: every band is hit
# name -> (transformers class prefix, config fields beside SMALL, the zoo fields they convert to)
MODELS = {
    "llama": ("Llama", dict(num_key_value_heads=2),
              dict(num_kv_heads=2, tie_embeddings=False, qkv_bias=False, out_bias=False, rope_scaling="none")),
    "llama3_bias": ("Llama", dict(num_key_value_heads=1, attention_bias=True, mlp_bias=True,
                                  rope_parameters=dict(LLAMA3_ROPE)),
                    dict(num_kv_heads=1, qkv_bias=True, out_bias=True, mlp_bias=True, rope_scaling="llama3",
                         rope_original_max_len=16, rope_theta=500000.0)),
    "qwen2": ("Qwen2", dict(num_key_value_heads=2, tie_word_embeddings=True,
                            rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
              dict(num_kv_heads=2, tie_embeddings=True, qkv_bias=True, out_bias=False, rope_theta=1e6)),
    "mistral": ("Mistral", dict(num_key_value_heads=2, sliding_window=4),
                dict(num_kv_heads=2, sliding_window=4, qkv_bias=False, tie_embeddings=False)),
}
# Llama 3's split regex: letters, numbers in threes, punctuation runs, whitespace
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT = "{% for m in messages %}{{ bos_token }}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}" \
       "{% if add_generation_prompt %}assistant:{% endif %}"
TEXTS = ["The if statement is used for conditional execution.", "  spaces\tand\nnewlines  ",
         "Unicode: naïve café 😀 3.14159", "I'm sure they'll've 12345678 items"]


def byte_level_tokenizer():
    """A Llama 3-style tokenizer: BPE over bytes after a split regex, BOS prepended, trained here."""
    from pydoc_data.topics import topics
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(list(topics.values())[:30], trainers.BpeTrainer(
        vocab_size=V, special_tokens=[BOS, EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, 0)])
    return tok


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """name -> (checkpoint directory, its transformers model); llama's directory holds the tokenizer."""
    out = {}
    for name, (prefix, fields, _) in MODELS.items():
        torch.manual_seed(0)
        cfg = getattr(transformers, f"{prefix}Config")(**SMALL, **fields)
        model = getattr(transformers, f"{prefix}ForCausalLM")(cfg).eval()
        d = tmp_path_factory.mktemp(name)
        model.save_pretrained(d)
        if name == "llama":
            fast = transformers.PreTrainedTokenizerFast(tokenizer_object=byte_level_tokenizer(), bos_token=BOS,
                                                        eos_token=EOS)
            fast.chat_template = CHAT
            fast.save_pretrained(d)
        out[name] = (str(d), model)
    return out


@pytest.fixture(scope="module")
def runs(hf_dirs, tmp_path_factory):
    return convert_all(hf_dirs, tmp_path_factory)


IDS = np.random.default_rng(0).integers(0, V, (2, 12))


@pytest.mark.parametrize("name", list(MODELS))
def test_logits_equal_transformers(hf_dirs, runs, name):
    run_dir, report = runs[name]
    assert report["unused"] == []
    zmodel, params, _, cfg = run_reader.load_run(run_dir)
    assert {k: getattr(cfg.model, k) for k in MODELS[name][2]} == MODELS[name][2]
    ours = np.asarray(zmodel.apply({"params": params}, jnp.asarray(IDS)))
    diff = np.abs(ours - hf_logits(hf_dirs[name][1], IDS)).max()
    print(f"{name}: max abs logit diff {diff:.2e}")
    assert diff <= 1e-4


@pytest.mark.parametrize("name", list(MODELS))
def test_greedy_generation_equals_transformers_generate(hf_dirs, runs, name):
    zmodel, params, _, _ = run_reader.load_run(runs[name][0])
    prompt = [5, 17, 42, 8]  # 4 + 8 tokens: past mistral's window of 4
    ours = generate(zmodel, params, prompt, 8, temperature=0.0)[0]
    with torch.no_grad():
        theirs = hf_dirs[name][1].generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False,
                                           pad_token_id=1, eos_token_id=None)[0, len(prompt):].tolist()
    assert ours == theirs


def test_plain_text_starts_with_the_bos_as_transformers_tokenizer_puts_it(hf_dirs, runs):
    """The Llama 3-style tokenizer puts <|begin_of_text|> before a text: zoo's plain-text ids are
    `tokenizer(text)`'s, so greedy `generate` continues what transformers' `generate` continues, and `logprobs`
    scores each token as transformers does after that BOS."""
    import zoo
    from zoo.api import decoder
    from zoo.data.tokenizers import encode_text
    src, torch_model = hf_dirs["llama"]
    theirs = transformers.AutoTokenizer.from_pretrained(src)
    lm = zoo.load(runs["llama"][0])
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
    from zoo.serve.engine import Engine
    lp, _, _ = Engine(lm, slots=1, max_len=64).score_program([text_ids], top=False)()[0]
    assert np.isnan(lp[0]) and len(lp) == len(text_ids)
    np.testing.assert_allclose(lp[1:], logp[np.arange(len(text_ids) - 1), text_ids[1:]], atol=1e-4)


@pytest.mark.parametrize("name", list(MODELS))
def test_export_loads_in_transformers_as_the_same_architecture(hf_dirs, runs, name, tmp_path):
    run_dir, report = runs[name]
    hf.to_hf(run_dir, str(tmp_path / "out"), verbose=False)
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    model = hf_dirs[name][1]
    assert (exported.config.model_type, type(exported)) == (model.config.model_type, type(model))
    np.testing.assert_allclose(hf_logits(exported, IDS), hf_logits(model, IDS), atol=1e-5)
    again = hf.from_hf(str(tmp_path / "out"), str(tmp_path / "again"), verbose=False)
    assert again["unused"] == [] and again["config"].model == report["config"].model
    for x, y in zip(jax.tree.leaves(again["params"]), jax.tree.leaves(report["params"])):
        np.testing.assert_array_equal(x, y)


def test_the_checkpoint_tokenizer_and_chat_template_travel_both_ways(hf_dirs, runs, tmp_path):
    src, run_dir = hf_dirs["llama"][0], runs["llama"][0]
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


def edited(src, dst, **fields) -> str:
    """A copy of checkpoint directory `src` whose config.json has `fields` set (None: removed)."""
    os.makedirs(dst)
    shutil.copy(os.path.join(src, "model.safetensors"), dst)
    hf_cfg = {**json.load(open(os.path.join(src, "config.json"))), **fields}
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump({k: v for k, v in hf_cfg.items() if v is not None}, f)
    return str(dst)


def test_the_older_rope_theta_and_rope_scaling_fields_convert_as_rope_parameters(hf_dirs, runs, tmp_path):
    src = hf_dirs["llama3_bias"][0]
    old = {k: v for k, v in LLAMA3_ROPE.items() if k not in ("rope_type", "rope_theta")}
    report = hf.from_hf(edited(src, tmp_path / "old", rope_parameters=None, rope_theta=500000.0,
                               rope_scaling={"type": "llama3", **old}), str(tmp_path / "run"), verbose=False)
    assert report["config"].model == runs["llama3_bias"][1]["config"].model


@pytest.mark.parametrize("name,fields,message", [
    ("llama", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}),
     r"^Llama rope type 'yarn' is not supported; supported: default, llama3$"),
    ("llama", dict(hidden_act="gelu"), r"^Llama hidden_act='gelu' is not supported"),
    ("mistral", dict(partial_rotary_factor=0.5), r"^Mistral partial_rotary_factor=0.5 is not supported"),
    ("qwen2", dict(use_sliding_window=True, layer_types=None), r"^Qwen2 use_sliding_window=true is not supported")])
def test_what_zoo_cannot_hold_is_refused_in_one_line(hf_dirs, tmp_path, name, fields, message):
    with pytest.raises(ConversionError, match=message) as e:
        hf.from_hf(edited(hf_dirs[name][0], tmp_path / "bad", **fields), str(tmp_path / "run"), verbose=False)
    assert "\n" not in str(e.value)
    assert not os.path.exists(tmp_path / "run")
