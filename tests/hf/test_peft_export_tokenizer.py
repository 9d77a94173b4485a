"""A PEFT adapter zoo writes (zoo.hf.peft_export) holds its run's tokenizer: `AutoTokenizer.from_pretrained(ADAPTER)`
gives zoo's ids, for a tokenizer directory copied from the Hugging Face base and for zoo's `bytes` (files built for
it); PEFT still loads the adapter with the LoRA run's logits. Its base is a Hugging Face directory written at most
once: the checkpoint the base was converted from while it is there; else (a GGUF base, a source since removed) the
base's export kept inside the base run, BASE_RUN/hf, which a second save names again without rewriting it.
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

torch = pytest.importorskip("torch", reason="torch is not installed: PEFT parity tests need transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
peft = pytest.importorskip("peft", reason="peft is not installed")

from tests.helpers.hf_runs import one_torch_thread  # noqa: F401,E402  (autouse fixture)
from zoo import hf, tasks  # noqa: E402
from zoo.data.tokenizers import get_tokenizer  # noqa: E402
from zoo.hf import convert, peft_export  # noqa: E402
from zoo.training import checkpoint, freeze, runs  # noqa: E402

V = 300
LLAMA = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1,
             initializer_range=0.2, attn_implementation="eager")
TEXTS = ["The capital of France is Paris.", "naïve café — ünïcödé, 1234 + 5678",
         "  two  spaces\nand a new line", "<|endoftext|> as plain text"]
IDS = np.random.default_rng(0).integers(0, V, (2, 12))


def _hf_tokenizer(path):
    """A byte-level BPE of 300 ids (trained here on TEXTS) saved as transformers saves a fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXTS * 20, trainers.BpeTrainer(
        vocab_size=V, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>").save_pretrained(path)


@pytest.fixture(scope="module")
def hf_base(tmp_path_factory):
    """(a small random Llama saved by transformers with its tokenizer, that directory converted into a zoo run)."""
    root = tmp_path_factory.mktemp("peft_tok")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).save_pretrained(root / "hf")
    _hf_tokenizer(root / "hf")
    hf.from_hf(str(root / "hf"), str(root / "base"), verbose=False)
    return str(root / "hf"), str(root / "base")


def lora_run(base, run_dir, tokenizer=None):
    """A LoRA run (rank 4 on every projection, random adapters: no training needed) on zoo run `base`; its data
    tokenizer is the base's unless `tokenizer` is given."""
    cfg = runs.load_config(base)
    cfg = dataclasses.replace(cfg, init_from=os.path.abspath(base),
                              model=dataclasses.replace(cfg.model, lora_rank=4, lora_alpha=8.0),
                              data=dataclasses.replace(cfg.data, tokenizer=tokenizer or cfg.data.tokenizer))
    task = tasks.build(cfg)
    boxed = jax.eval_shape(task.init, jax.random.PRNGKey(0))
    trained = freeze.split(nn.unbox(boxed), runs.trainable_of(cfg, boxed, task.seen))[0]
    rng = np.random.default_rng(1)
    checkpoint.save_weights(run_dir, jax.tree.map(lambda s: 0.2 * rng.standard_normal(s.shape, np.float32),
                                                  trained), cfg)
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        f.write(cfg.to_json())
    return str(run_dir), cfg


def zoo_logits(run_dir):
    model, params, _, _ = runs.load_run(run_dir)
    return np.asarray(jax.jit(model.apply)({"params": params}, jnp.asarray(IDS)))


def hf_logits(model):
    with torch.no_grad():
        return model(torch.tensor(IDS)).logits.numpy()


def auto_ids(path, text):
    return transformers.AutoTokenizer.from_pretrained(path)(text, add_special_tokens=False)["input_ids"]


def test_the_adapter_folder_holds_the_base_s_tokenizer_and_still_loads_in_peft(hf_base, tmp_path):
    hf_dir, base = hf_base
    run, cfg = lora_run(base, tmp_path / "lora")
    import zoo
    out = zoo.load(run).save(str(tmp_path / "adapter"), format="peft", verbose=False)
    held = set(os.listdir(out))
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= held
    assert "base" not in held  # the base is the Hugging Face directory it was converted from
    assert json.load(open(os.path.join(out, "adapter_config.json")))["base_model_name_or_path"] == hf_dir
    ours = get_tokenizer(cfg.data.tokenizer)
    for text in TEXTS:
        ids = auto_ids(out, text)
        assert ids == ours.encode(text) == auto_ids(hf_dir, text)
        assert len(ids) < len(text.encode())  # BPE merges: not bytes in disguise
    adapted = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(hf_dir), out).eval()
    assert np.abs(hf_logits(adapted) - zoo_logits(run)).max() <= 1e-4


def test_a_bytes_run_s_adapter_gets_tokenizer_files_built_for_bytes(hf_base, tmp_path):
    _, base = hf_base
    run, _ = lora_run(base, tmp_path / "lora", tokenizer="bytes")
    peft_export.to_peft(run, str(tmp_path / "adapter"), verbose=False)
    ours = get_tokenizer("bytes")
    for text in TEXTS:
        assert auto_ids(str(tmp_path / "adapter"), text) == ours.encode(text) == list(text.encode())


@pytest.mark.parametrize("origin", ["gguf", "hf removed"])
def test_a_base_with_no_hugging_face_directory_is_exported_once_inside_it(hf_base, origin, tmp_path):
    """A base converted from a GGUF file (origin.json says so; the conversion itself is tests/hf/test_smollm2.py's),
    or from a Hugging Face directory since removed: the first adapter exports it into BASE/hf, the second names
    the same directory without writing it again; transformers + PEFT open the adapter folder alone."""
    hf_dir, base = hf_base
    shutil.copytree(base, tmp_path / "base")
    base = str(tmp_path / "base")
    if origin == "gguf":
        convert.write_origin(base, "gguf", str(tmp_path / "model.gguf"))
    else:
        shutil.copytree(hf_dir, tmp_path / "gone")
        convert.write_origin(base, "hf", str(tmp_path / "gone"))
        shutil.rmtree(tmp_path / "gone")
    run, _ = lora_run(base, tmp_path / "lora")
    kept = os.path.join(base, "hf", "model.safetensors")
    peft_export.to_peft(run, str(tmp_path / "first"), verbose=False)
    written = os.stat(kept)
    peft_export.to_peft(run, str(tmp_path / "second"), verbose=False)
    for out in ("first", "second"):
        assert json.load(open(tmp_path / out / "adapter_config.json"))["base_model_name_or_path"] == \
            os.path.join(base, "hf")
        assert not os.path.exists(tmp_path / out / "base")
    again = os.stat(kept)
    assert (again.st_ino, again.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)  # not rewritten
    assert sorted(f for f in os.listdir(base) if f.startswith("hf")) == ["hf"]  # no temporary left
    model = peft.AutoPeftModelForCausalLM.from_pretrained(str(tmp_path / "second")).eval()
    assert np.abs(hf_logits(model) - zoo_logits(run)).max() <= 1e-4


def test_a_base_zoo_cannot_write_in_is_exported_beside_the_adapter(hf_base, tmp_path, monkeypatch):
    _, base = hf_base
    shutil.copytree(base, tmp_path / "base")
    base = str(tmp_path / "base")
    convert.write_origin(base, "gguf", str(tmp_path / "model.gguf"))
    run, _ = lora_run(base, tmp_path / "lora")
    monkeypatch.setattr(os, "access", lambda path, mode: os.path.abspath(path) != base)  # a read-only base (as root)
    peft_export.to_peft(run, str(tmp_path / "adapter"), verbose=False)
    assert json.load(open(tmp_path / "adapter" / "adapter_config.json"))["base_model_name_or_path"] == \
        str(tmp_path / "adapter" / "base")
    assert os.path.isfile(tmp_path / "adapter" / "base" / "model.safetensors") and not os.path.exists(
        os.path.join(base, "hf"))


def test_a_second_peft_save_of_one_model_only_writes(hf_base, tmp_path, monkeypatch):
    """Pretrained.save(format="peft") keeps what the run gives (its adapters restored, the model's shapes traced) on
    the model: a second save restores and traces nothing and writes the same files; a step the run saved since is
    read afresh."""
    import zoo
    from zoo.hf import peft as peft_layers
    _, base = hf_base
    run, cfg = lora_run(base, tmp_path / "lora")
    calls = {"load_trained": 0, "layers": 0}

    def counted(module, name):
        real = getattr(module, name)

        def wrapper(*a, **k):
            calls[name] += 1
            return real(*a, **k)
        monkeypatch.setattr(module, name, wrapper)
    lm = zoo.load(run)
    counted(runs, "load_trained")
    counted(peft_layers, "layers")
    lm.save(str(tmp_path / "first"), format="peft", verbose=False)
    assert calls == {"load_trained": 1, "layers": 1}
    lm.save(str(tmp_path / "second"), format="peft", verbose=False)
    assert calls == {"load_trained": 1, "layers": 1}  # nothing restored or traced again
    assert sorted(os.listdir(tmp_path / "first")) == sorted(os.listdir(tmp_path / "second"))
    for name in os.listdir(tmp_path / "first"):
        assert (tmp_path / "first" / name).read_bytes() == (tmp_path / "second" / name).read_bytes(), name
    trained = runs.load_trained(run, cfg)[0]  # a newer step of the run: its adapters, not the kept ones
    checkpoint.save_weights(run, jax.tree.map(lambda x: 2 * x, trained), cfg, step=5)
    calls["load_trained"] -= 1
    lm.save(str(tmp_path / "third"), format="peft", verbose=False)
    assert calls == {"load_trained": 2, "layers": 2}
    assert (tmp_path / "third" / "adapter_model.safetensors").read_bytes() != \
        (tmp_path / "first" / "adapter_model.safetensors").read_bytes()
