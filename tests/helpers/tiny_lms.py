"""Tiny random causal LMs built with transformers and saved as Hugging Face directories, for the tests that
compare zoo's scores with torch's (tests/eval). Their vocabulary of 260 holds zoo's byte tokenizer (ids
0-256, 256 its end-of-text), so a converted run scores text with data.tokenizer=bytes."""

import torch
import transformers

VOCAB, CONTEXT, EOT = 260, 32, 256


def gpt2(path):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=CONTEXT,
                                  bos_token_id=EOT, eos_token_id=EOT)
    return _save(transformers.GPT2LMHeadModel(cfg), path)


def llama(path):
    torch.manual_seed(0)
    # initializer_range 0.2: attention far from uniform, so wrong positions in a window change the scores.
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT,
                                   bos_token_id=EOT, eos_token_id=EOT, initializer_range=0.2,
                                   attn_implementation="eager")
    return _save(transformers.LlamaForCausalLM(cfg), path)


def _save(model, path):
    model.eval().save_pretrained(path)
    return model


BUILDERS = {"gpt2": gpt2, "llama": llama}


def gpt2_run(tmp_path_factory) -> str:
    """A zoo run converted from the tiny GPT-2 (byte tokenizer), for tests that only need a run to score."""
    from zoo import hf
    src = tmp_path_factory.mktemp("gpt2") / "hf"
    gpt2(src)
    out = str(tmp_path_factory.mktemp("gpt2") / "run")
    hf.from_hf(str(src), out, verbose=False)
    return out
