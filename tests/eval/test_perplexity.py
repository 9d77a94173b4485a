"""zoo-eval's perplexity: per-document log-likelihoods under the sliding window equal transformers' own loop
(the perplexity guide's) on a tiny GPT-2 and a tiny Llama; every token is scored once; bits per byte are the
total NLL over ln 2 and the UTF-8 bytes; bad arguments and non-GPT runs are one error line."""

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the reference loop runs transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from tests.helpers import tiny_lms  # noqa: E402
from tests.helpers.hf_runs import one_torch_thread  # noqa: F401,E402  (autouse fixture)
from tests.helpers.runs import write_jsonl  # noqa: E402
from zoo import hf  # noqa: E402
from zoo.cli import eval as zoo_eval  # noqa: E402
from zoo.eval import perplexity  # noqa: E402
from zoo.eval.loglik import prefix_token  # noqa: E402

CONTEXT, EOT = tiny_lms.CONTEXT, tiny_lms.EOT
# A short document, one of exactly the context, and two of several windows (one not ASCII: bytes != characters).
TEXTS = ["Hello.", "x" * (CONTEXT - 1),
         "The if statement is used for conditional execution; elif and else follow it. " * 2,
         "Unicode: naïve café — ünïcödé, and a few more words to pass the context of the model."]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (zoo run directory, the transformers model it was converted from)."""
    out = {}
    for name, build in tiny_lms.BUILDERS.items():
        src = tmp_path_factory.mktemp(name) / "hf"
        model = build(src)
        run = str(tmp_path_factory.mktemp(name) / "run")
        hf.from_hf(str(src), run, verbose=False)
        out[name] = (run, model)
    return out


def reference_loglik(model, ids, max_length, stride):
    """(log-likelihood, tokens scored) of one document, EOT-prefixed, with the perplexity guide's loop."""
    seq = torch.tensor([[EOT, *ids]])
    n, prev_end, nll, count = seq.size(1), 0, 0.0, 0
    for begin in range(0, n, stride):
        end = min(begin + max_length, n)
        trg_len = end - prev_end  # may differ from stride on the last window
        input_ids = seq[:, begin:end]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        with torch.no_grad():
            loss = model(input_ids, labels=target_ids).loss  # the mean over the labels the shift keeps
        valid = int((target_ids[:, 1:] != -100).sum())
        nll += float(loss) * valid
        count += valid
        prev_end = end
        if end == n:
            break
    return -nll, count


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("stride", [16, 7])
def test_document_logliks_equal_the_transformers_sliding_window_loop(models, name, stride):
    run, model = models[name]
    zmodel, params, tok, cfg = hf.from_pretrained(run)
    docs = tok.encode_batch(TEXTS)
    ours = perplexity.document_logliks(zmodel, params, docs, prefix=EOT, context=cfg.window, stride=stride,
                                       batch_size=4)
    ref = [reference_loglik(model, ids, CONTEXT, stride) for ids in docs]
    assert cfg.window == CONTEXT
    np.testing.assert_allclose(ours, [ll for ll, _ in ref], rtol=0, atol=1e-4)
    assert [n for _, n in ref] == [len(d) for d in docs]  # the reference too scores every token once


@pytest.mark.parametrize("n, stride", [(200, 16), (200, 1), (200, 31), (33, 16), (32, 5), (2, 16)])
def test_every_token_after_the_prefix_is_scored_once_with_context(n, stride):
    ws = perplexity.windows(n, CONTEXT, stride)
    scored = [p for _, end, s in ws for p in range(end - s, end)]
    assert scored == list(range(1, n))  # once each, in order, the prefix never
    assert all(end - begin <= CONTEXT for begin, end, _ in ws)
    for begin, end, s in ws[1:]:  # a later window's first scored token has context - stride tokens before it
        assert end - s - begin >= CONTEXT - stride


def test_a_stride_of_the_whole_context_is_refused():
    with pytest.raises(ValueError, match="--stride 32 must be between 1 and the context minus one"):
        perplexity.windows(100, CONTEXT, CONTEXT)


def test_zoo_eval_reports_tokens_bytes_and_bits_per_byte_of_the_total_nll(models, tmp_path, capsys):
    run, model = models["gpt2"]
    data = write_jsonl(tmp_path / "docs.jsonl", [{"body": t} for t in TEXTS])
    assert zoo_eval.main([run, "--data", data, "--text-column", "body", "--json", "--cache-dir",
                          str(tmp_path / "cache")]) == 0
    out = json.loads(capsys.readouterr().out)
    total = -sum(reference_loglik(model, list(t.encode("utf-8")), CONTEXT, CONTEXT // 2)[0] for t in TEXTS)
    n_bytes = sum(len(t.encode("utf-8")) for t in TEXTS)
    assert n_bytes > sum(map(len, TEXTS))  # the accents count twice
    assert (out["documents"], out["tokens"], out["bytes"], out["stride"]) == (4, n_bytes, n_bytes, 16)
    assert out["bits_per_byte"] == pytest.approx(total / math.log(2) / n_bytes, rel=1e-6)
    assert out["perplexity"] == pytest.approx(math.exp(total / out["tokens"]), rel=1e-6)


def test_max_docs_and_the_table_for_people(models, tmp_path, capsys):
    run, _ = models["llama"]
    data = write_jsonl(tmp_path / "docs.jsonl", [{"text": t} for t in TEXTS])
    assert zoo_eval.main([run, "--data", data, "--max-docs", "2", "--cache-dir", str(tmp_path / "cache")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{run} on {data} (context 32, stride 16)"
    rows = dict(line.split(None, 1) for line in lines[1:])
    assert list(rows) == ["documents", "tokens", "bytes", "NLL/token", "perplexity", "bits/byte"]
    assert (rows["documents"], rows["tokens"]) == ("2", str(len(TEXTS[0]) + len(TEXTS[1])))


def error_line(capsys):
    cap = capsys.readouterr()
    lines = [line for line in cap.err.splitlines() if line.strip()]
    assert cap.out == "" and len(lines) == 1, cap
    return lines[0]


def test_a_bert_checkpoint_is_refused_in_one_line(tmp_path, capsys):
    cfg = transformers.BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=32)
    transformers.BertForMaskedLM(cfg).save_pretrained(tmp_path / "bert")
    capsys.readouterr()  # transformers' own bar
    assert zoo_eval.main([str(tmp_path / "bert"), "--data", "builtin"]) == 2
    assert error_line(capsys) == (f"error: zoo-eval scores GPT-family runs; {tmp_path / 'bert'} is a bert run; a "
                                  f"masked LM (task bert_mlm) is scored with --task mlm")


@pytest.mark.parametrize("args, fragment", [
    (["--data", "builtin", "--stride", "32"], "--stride 32 must be between 1 and the context minus one (31)"),
    (["--data", "builtin", "--max-docs", "0"], "--max-docs 0 must be >= 1"),
    ([], "give --data SOURCE"),
    (["--data", "{tmp}/missing.jsonl"], "missing.jsonl"),
])
def test_bad_arguments_are_one_error_line(models, tmp_path, capsys, args, fragment):
    run, _ = models["gpt2"]
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert zoo_eval.main([run, *args, "--cache-dir", str(tmp_path / "cache")]) == 2
    line = error_line(capsys)
    assert line.startswith("error: ") and fragment.replace("{tmp}", str(tmp_path)) in line


def test_a_directory_that_is_no_run_is_refused_before_loading(tmp_path, capsys):
    assert zoo_eval.main([str(tmp_path), "--data", "builtin"]) == 2
    assert error_line(capsys) == (f"error: {str(tmp_path)!r} is neither a zoo run (no checkpoints/), a Hugging "
                                  f"Face checkpoint directory (no config.json), a PEFT adapter (no "
                                  f"adapter_config.json) nor a .gguf file")


def test_documents_start_from_bos_where_the_tokenizer_has_one_else_end_of_text():
    class Llama:
        eot_token, bos_token = 2, 0  # id 0 is a BOS like any other

    class Gpt2:
        eot_token = 50256

    assert (prefix_token(Llama()), prefix_token(Gpt2())) == (0, 50256)


def test_documents_of_many_lengths_compile_a_few_bucketed_shapes(models):
    from zoo.eval import loglik
    zmodel, params, _, cfg = hf.from_pretrained(models["gpt2"][0])
    docs = [[7] * n for n in range(1, 31)]  # 30 lengths, one window each: 15 batches of 2
    before = loglik._row_loglik._cache_size()
    perplexity.document_logliks(zmodel, params, docs, prefix=EOT, context=CONTEXT, stride=16, batch_size=2)
    assert loglik._row_loglik._cache_size() - before <= 3  # 2 rows x 8, 16 or 32 positions


def test_a_tokenizer_with_ids_beyond_the_model_vocabulary_is_refused(tmp_path, capsys):
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=99, n_positions=32)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "gpt2")  # no tokenizer: zoo reads bytes
    capsys.readouterr()
    assert zoo_eval.main([str(tmp_path / "gpt2"), "--data", "builtin", "--max-docs", "1"]) == 2
    assert error_line(capsys).startswith("error: the tokenizer 'bytes' gives id 256, beyond the 99 tokens of ")
