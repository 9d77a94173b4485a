"""Evaluate a GPT-family run as users do: perplexity and bits per byte of a corpus, or multiple choice.

    zoo-eval runs/x --data builtin                      # every document of a source zoo reads
    zoo-eval runs/x --data notes.jsonl --text-column body --max-docs 100 --stride 256 --json
    zoo-eval runs/x --task choice questions.jsonl       # {"context", "choices", "answer"} per line
    zoo-eval runs/x --task choice builtin               # the set zoo builds offline (zoo.eval.sets)
    zoo-eval runs/x --data builtin --held-out           # only the documents the run's training held out
    zoo-eval runs/chat --task generate qa.jsonl         # {"messages" | "prompt", "answer"} per line
    zoo-eval runs/cls --data test.jsonl                 # a [CLS] classifier: accuracy, macro-F1, confusion
    zoo-eval runs/ner --data test.jsonl --text-column tokens --label-column ner_tags  # entity P/R/F1 per type
    zoo-eval runs/mlm --data held_out.txt               # a masked-LM run: pseudo-accuracy on masked tokens
    zoo-eval runs/s2s --data pairs.jsonl --beam 4       # an encoder-decoder run: BLEU and exact match
    zoo-eval MINILM --task retrieval scifact/          # embeddings on a BEIR folder: nDCG@10, MRR@10, recall@k
    zoo-eval bm25 --task retrieval builtin              # the lexical baseline on the offline pydoc set

Run the same command on every process of a multi-host job (zoo.distributed: started by itself on SLURM, Open
MPI and TPU pods, or by --coordinator/--num-processes/--process-id): each scores its share of the documents
or questions and process 0 prints the sums, equal to one process's.

RUN is a zoo run directory or a Hugging Face checkpoint directory (converted in memory). Perplexity
scores each document whole, its first token conditioned on the tokenizer's BOS (else its end-of-text
token), with a sliding window of the run's context (`--stride`, default half of it) over longer
documents: zoo.eval.perplexity. Multiple choice reports acc and acc_norm as lm-evaluation-harness
defines them: zoo.eval.choice. Generation answers each row greedily and reports exact match and
contains-answer, printing the worst rows: zoo.eval.generation. A BERT classification run (task bert_cls)
is scored on a labelled source (--text-column, --pair-column, --label-column): zoo.eval.classification. A
token-classification run (task bert_tokens) is scored on a word-tagged source (--text-column of word lists,
--label-column of tag lists): entity precision, recall and F1 over IOB2 spans, per type too, and word
accuracy: zoo.tasks.token_classify.evaluate_source, zoo.tasks.entities. A masked-LM run (bert_mlm) reports
its pseudo-accuracy, loss and perplexity on masked tokens of a held-out source: zoo.eval.mlm. An encoder-decoder
run (seq2seq) decodes a source/target file (--source-column, --target-column; greedy or --beam N) and reports
corpus BLEU and exact match, printing the worst rows: zoo.eval.seq2seq. Any encoder or decoder embeds the queries
and the corpus of a BEIR-layout folder (Pretrained.embed) and is scored by exact cosine search: nDCG@10, MRR@10
and recall@1/10/100, zoo.eval.retrieval.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

import numpy as np

from zoo import runtime
from zoo.cli import BAD_INPUT, error
from zoo.cli.eval_table import table

TASKS = ("perplexity", "choice", "generate", "classify", "tokens", "mlm", "translate", "retrieval")
# A run of these tasks is scored by its own kind of evaluation.
RUN_TASKS = {"bert_cls": "classify", "bert_tokens": "tokens", "bert_mlm": "mlm", "seq2seq": "translate"}
NEEDS_DATA = {"classify": "a labelled file, directory or hub:NAME to classify",
              "tokens": "a labelled file, directory or hub:NAME to tag",
              "mlm": "a held-out text source (builtin, a file, a directory, hub:NAME) to mask and predict",
              "translate": "a source/target file, directory or hub:NAME to translate",
              "perplexity": "a text source to score (builtin, a file, a directory, hub:NAME)",
              "retrieval": "a BEIR dataset folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv) or builtin"}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="zoo-eval", description=__doc__.split("\n")[0])
    ap.add_argument("workdir", metavar="RUN", help="a zoo run directory, or a Hugging Face checkpoint directory")
    ap.add_argument("file", nargs="?", metavar="FILE.jsonl", help="--task choice: the questions; --task generate: "
                                                                  "the prompts and their answers")
    ap.add_argument("--task", choices=TASKS, default="perplexity", help="what to score (default: %(default)s)")
    ap.add_argument("--data", metavar="SOURCE",
                    help="perplexity: builtin, shakespeare, hub:NAME[/CONFIG], or a txt/json/jsonl/parquet/csv/tsv "
                         "file, directory or glob")
    ap.add_argument("--text-column", default="text", help="the column of text (default: %(default)s)")
    ap.add_argument("--pair-column", default="", help="classify: a second text column (sentence pairs)")
    ap.add_argument("--label-column", default="label", help="classify: the column of labels; tokens: of tag lists "
                                                            "(default: %(default)s)")
    ap.add_argument("--source-column", default="source", help="translate: the column of inputs ('a.b': key b of "
                                                              "dict column a; default: %(default)s)")
    ap.add_argument("--target-column", default="target", help="translate: the column of expected outputs "
                                                              "(default: %(default)s)")
    ap.add_argument("--beam", type=int, default=1, help="translate: beam size; 1 is greedy (default: %(default)s)")
    ap.add_argument("--held-out", action="store_true",
                    help="perplexity: only the documents a zoo run's training held out (its data.val_fraction, "
                         "split by document hash as the token store splits)")
    ap.add_argument("--index", choices=("exact", "faiss"), default="exact", help="retrieval: search exactly on "
                    "the device, or with faiss-cpu's IndexFlatIP on the host (default: %(default)s)")
    ap.add_argument("--split", help="the split of a hub or local dataset (default: train; retrieval: the qrels' test)")
    ap.add_argument("--max-docs", type=int, help="score the first N documents (questions with --task choice)")
    ap.add_argument("--stride", type=int, help="tokens between window starts (default: half the context)")
    ap.add_argument("--delimiter", default=" ", help="choice: put between context and each choice "
                                                     "(the harness's target_delimiter; default: a space)")
    ap.add_argument("--cache-dir", default="~/.cache/zoo",
                    help="where a local source's Arrow copy is kept (data.cache_dir; default: %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=64,
                    help="generate: the longest answer, in tokens (default: %(default)s)")
    ap.add_argument("--show", type=int, default=5, help="generate: the worst rows printed (default: %(default)s)")
    ap.add_argument("--batch-size", type=int, default=8, help="rows per forward pass (default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    from zoo import distributed
    distributed.add_arguments(ap)
    return ap


def _check_args(a) -> None:
    from zoo.errors import ZooDataError
    if a.task == "perplexity" and _run_task(a.workdir) in RUN_TASKS:  # a classifier has no perplexity
        a.task = RUN_TASKS[_run_task(a.workdir)]
    a.split = a.split or ("test" if a.task == "retrieval" else "train")
    if a.task == "retrieval" and a.file and not a.data:  # zoo-eval MODEL --task retrieval DIR
        a.data, a.file = a.file, None
    bm25 = a.workdir == "bm25" and not os.path.exists(a.workdir)  # the lexical baseline, no checkpoint
    if bm25 and a.task != "retrieval":
        raise ZooDataError(f"bm25 is a retrieval baseline (--task retrieval); --task {a.task} scores a run or a "
                           f"checkpoint")
    if a.task in NEEDS_DATA and not a.data:
        raise ZooDataError(f"give --data SOURCE: {NEEDS_DATA[a.task]}")
    if a.held_out and a.task != "perplexity":
        raise ZooDataError(f"--held-out picks the documents perplexity scores; --task {a.task} reads its own file")
    if a.held_out and _run_config(a.workdir) is None:
        raise ZooDataError(f"--held-out needs a zoo run (its data.val_fraction); {a.workdir!r} is not one")
    if a.task == "perplexity" and a.file:
        raise ZooDataError(f"{a.file!r}: a questions file goes with --task choice; perplexity reads --data")
    if a.task in ("choice", "generate") and not (a.file or a.data):
        what = "the questions" if a.task == "choice" else "the prompts and answers"
        raise ZooDataError(f"--task {a.task} needs {what}: zoo-eval RUN --task {a.task} FILE.jsonl")
    for flag, v in (("--max-docs", a.max_docs), ("--stride", a.stride), ("--batch-size", a.batch_size),
                    ("--max-new-tokens", a.max_new_tokens), ("--beam", a.beam)):
        if v is not None and v < 1:
            raise ZooDataError(f"{flag} {v} must be >= 1")
    if a.data and glob.glob(os.path.expanduser(a.data)):  # local files: their Arrow copy goes under --cache-dir
        runtime.check_cache_dir(a.cache_dir, "--cache-dir", "--cache-dir ~/.cache/zoo")
    if not bm25 and not (os.path.isdir(os.path.join(a.workdir, "checkpoints"))
            or os.path.isfile(os.path.join(a.workdir, "config.json"))
            or os.path.isfile(os.path.join(a.workdir, "adapter_config.json"))
            or (a.workdir.endswith(".gguf") and os.path.isfile(a.workdir))):
        raise ZooDataError(f"{a.workdir!r} is neither a zoo run (no checkpoints/), a Hugging Face checkpoint "
                           f"directory (no config.json), a PEFT adapter (no adapter_config.json) nor a .gguf file")


def _run_config(workdir: str) -> dict | None:
    """A zoo run's config.json as a dict (read without jax), None for anything else (a Hugging Face dir)."""
    try:
        with open(os.path.join(workdir, "config.json")) as f:
            d = json.load(f)
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) and "task" in d and "data" in d else None


def _run_task(workdir: str) -> str | None:
    """The task in a zoo run's config.json, None for anything else."""
    return (_run_config(workdir) or {}).get("task")


def _load(workdir: str, task: str = "gpt"):
    """zoo.load(workdir), of the family or task `task`: a Pretrained, which unpacks as (model, params, tok, cfg)."""
    import zoo
    lm = zoo.load(workdir)
    cfg = lm.config
    if task == "bert_cls" and cfg.task != "bert_cls":
        raise ValueError(f"--task classify scores BERT classification runs (task bert_cls); {workdir} is a {cfg.task} "
                         f"run")
    if task == "bert_tokens" and cfg.task != "bert_tokens":
        raise ValueError(f"--task tokens scores BERT token-classification runs (task bert_tokens); {workdir} is a "
                         f"{cfg.task} run")
    if task in RUN_TASKS and cfg.task != task:
        raise ValueError(f"--task {RUN_TASKS[task]} scores {task} runs; {workdir} is a {cfg.task} run")
    if task == "gpt" and cfg.model.family != "gpt":
        kinds = {"bert_cls": "a classifier", "bert_tokens": "a token classifier", "bert_mlm": "a masked LM",
                 "seq2seq": "an encoder-decoder"}
        hint = f"; {kinds[cfg.task]} (task {cfg.task}) is scored with --task {RUN_TASKS[cfg.task]}" \
            if cfg.task in RUN_TASKS else ""
        raise ValueError(f"zoo-eval scores GPT-family runs; {workdir} is a {cfg.model.family} run{hint}")
    return lm


def classify(a) -> dict:
    from zoo.api.encoder import class_names
    from zoo.configuration import DataConfig
    from zoo.eval import classification
    if not sys.stderr.isatty():
        import datasets
        datasets.disable_progress_bars()  # its bars are noise in a log
    lm = _load(a.workdir, "bert_cls")
    model, params, tok, cfg = lm
    data = DataConfig(source=a.data, text_column=a.text_column, text_pair_column=a.pair_column,
                      label_column=a.label_column, split=a.split, cache_dir=a.cache_dir)
    out = classification.evaluate(model, params, tok, cfg, class_names(lm), data,
                                  batch_size=a.batch_size, max_rows=a.max_docs)
    if _peers().gather("classify", {}) is None:  # several processes: each scored every row; process 0 prints
        return None
    return {"run": a.workdir, "data": a.data, **out}


def retrieval(a) -> dict:
    import zoo
    from zoo.eval import retrieval as beir
    if not os.path.isdir(a.data) and a.data != beir.BUILTIN:
        raise FileNotFoundError(f"--data {a.data!r}: no such folder ({NEEDS_DATA['retrieval']})")
    from zoo.api.embed import pooling_of
    lm = a.workdir if a.workdir == "bm25" and not os.path.exists(a.workdir) else zoo.load(a.workdir)
    out = beir.evaluate(lm, a.data, split=a.split, batch_size=a.batch_size, max_docs=a.max_docs, index=a.index,
                        prompts=[] if isinstance(lm, str) else [name for name, _ in pooling_of(lm).prompts])
    if _peers().gather("retrieval", {}) is None:  # several processes: each searched every query; process 0 prints
        return None
    return {"run": a.workdir, "data": a.data, "split": a.split, **out}


def tokens(a) -> dict:
    from zoo.api.encoder import class_names
    from zoo.configuration import DataConfig
    from zoo.tasks import token_classify
    if not sys.stderr.isatty():
        import datasets
        datasets.disable_progress_bars()  # its bars are noise in a log
    lm = _load(a.workdir, "bert_tokens")
    model, params, tok, cfg = lm
    data = DataConfig(source=a.data, text_column=a.text_column, label_column=a.label_column, split=a.split,
                      cache_dir=a.cache_dir)
    out = token_classify.evaluate_source(model, params, tok, class_names(lm), data,
                                         batch_size=a.batch_size, max_rows=a.max_docs)
    if _peers().gather("tokens", {}) is None:  # several processes: each scored every row; process 0 prints
        return None
    return {"run": a.workdir, "data": a.data, **out}


def mlm(a) -> dict:
    from zoo.configuration import DataConfig
    from zoo.eval import mlm as mlm_eval
    from zoo.tasks import build
    _, params, tok, cfg = _load(a.workdir, "bert_mlm")
    data = DataConfig(source=a.data, text_column=a.text_column, split=a.split, cache_dir=a.cache_dir)
    out = mlm_eval.evaluate(build(cfg), params, tok, data, batch_size=a.batch_size, max_docs=a.max_docs)
    if _peers().gather("mlm", {}) is None:  # several processes: each scored every row; process 0 prints
        return None
    return {"run": a.workdir, "data": a.data, **out}


def translate(a) -> dict:
    from zoo.configuration import DataConfig
    from zoo.eval import seq2seq
    model, params, tok, cfg = _load(a.workdir, "seq2seq")
    data = DataConfig(source=a.data, source_column=a.source_column, target_column=a.target_column, split=a.split,
                      cache_dir=a.cache_dir)
    out = seq2seq.evaluate(model, params, tok, cfg, data, beam=a.beam, batch_size=a.batch_size, max_rows=a.max_docs,
                           worst=a.show)
    if _peers().gather("translate", {}) is None:
        return None
    return {"run": a.workdir, "data": a.data, **out}


def _progress(total: int, what: str):
    """A tqdm bar on a terminal, else nothing: (update function, close function)."""
    if not sys.stderr.isatty():
        return None, lambda: None
    from tqdm import tqdm
    bar = tqdm(total=total, unit=what, file=sys.stderr, leave=False)
    return bar.update, bar.close


def _documents(a) -> list[str]:
    from zoo.configuration import DataConfig
    from zoo.data.corpus import load_documents
    from zoo.errors import ZooDataError
    if not sys.stderr.isatty():
        import datasets
        datasets.disable_progress_bars()  # its bars are noise in a log
    ds = load_documents(DataConfig(source=a.data, text_column=a.text_column, split=a.split, cache_dir=a.cache_dir))
    if a.held_out:  # the run's validation documents, chosen as its token store chose them
        from zoo.data.store import doc_hash
        fraction = _run_config(a.workdir)["data"]["val_fraction"]
        ds = ds.filter(lambda b: [doc_hash(t) < fraction for t in b["text"]], batched=True)
        if len(ds) == 0:
            raise ZooDataError(f"--held-out: no document of {a.data} falls in {a.workdir}'s held-out fraction "
                               f"({fraction})")
    if a.max_docs is not None:
        ds = ds.select(range(min(a.max_docs, len(ds))))
    return list(ds["text"])


def perplexity(a) -> dict:
    from zoo.eval import perplexity as ppl
    from zoo.eval.loglik import prefix_token
    texts = _documents(a)  # a bad source is refused before the model loads
    model, params, tok, cfg = _load(a.workdir)
    context = cfg.window
    stride = a.stride or max(1, context // 2)
    ppl.check_window(context, stride)
    all_docs = tok.encode_batch(texts)
    prefix = prefix_token(tok)
    _check_vocab(all_docs + [[prefix]], tok, cfg, a.workdir)
    docs = _peers().share(all_docs)
    update, close = _progress(sum(len(ppl.windows(len(d) + 1, context, stride)) for d in docs), "window")
    try:
        lls = ppl.document_logliks(model, params, docs, prefix=prefix, context=context, stride=stride,
                                   batch_size=a.batch_size, progress=update)
    finally:
        close()
    parts = _peers().gather("perplexity", {"nll": -float(np.sum(lls, dtype=np.float64))})
    if parts is None:
        return None
    out = ppl.summary(sum(p["nll"] for p in parts), sum(map(len, all_docs)),
                      sum(len(t.encode("utf-8")) for t in texts), len(all_docs))
    return {"run": a.workdir, "data": a.data, "context": context, "stride": stride, **out}


def choice(a) -> dict:
    from zoo.eval import choice as mc
    from zoo.eval.loglik import prefix_token
    from zoo.eval import sets
    path = a.file or a.data
    questions = (sets.named(path) if path in sets.NAMED and not os.path.exists(path) else
                 mc.read_questions(path))[:a.max_docs]  # checked before the model loads
    model, params, tok, cfg = _load(a.workdir)
    prefix = prefix_token(tok)
    _check_vocab([tok.encode(q["context"] + "".join(q["choices"])) for q in questions] + [[prefix]], tok, cfg,
                 a.workdir)
    mine = _peers().share(questions)
    update, close = _progress(sum(len(q["choices"]) for q in mine), "choice")
    try:
        out = mc.evaluate(model, params, tok, mine, prefix=prefix, context=cfg.window,
                          delimiter=a.delimiter, batch_size=a.batch_size, progress=update) if mine else \
            {"questions": 0, "correct": 0, "correct_norm": 0, "logliks": []}
    finally:
        close()
    parts = _peers().gather("choice", {k: out[k] for k in ("questions", "correct", "correct_norm", "logliks")})
    if parts is None:
        return None
    n, c, cn = (sum(p[k] for p in parts) for k in ("questions", "correct", "correct_norm"))
    logliks = [parts[i % len(parts)]["logliks"][i // len(parts)] for i in range(n)]  # back in the file's order
    out = {"questions": n, "acc": c / n, "acc_norm": cn / n, "correct": c, "correct_norm": cn, "logliks": logliks}
    return {"run": a.workdir, "data": path, "context": cfg.window, **out}


def generate(a) -> dict:
    from zoo.eval import generation as gen
    path = a.file or a.data
    items = [{**r, "index": i} for i, r in enumerate(gen.read_items(path)[:a.max_docs])]  # checked before loading
    lm = _load(a.workdir)
    model, params = lm.decoding()  # the layers as one scan: one layer compiled (zoo.infer.sample.scanned)
    cfg = lm.config
    mine = _peers().share(items)
    update, close = _progress(len(mine), "answer")
    try:
        out = gen.evaluate(model, params, lm.tokenizer, cfg.data.tokenizer, mine, run_dir=lm.run_dir,
                           window=cfg.window, max_new_tokens=a.max_new_tokens, batch_size=a.batch_size,
                           progress=update)
    finally:
        close()
    parts = _peers().gather("generate", out)
    if parts is None:
        return None
    rows = sorted((r for p in parts for r in p["rows"]), key=lambda r: r["index"])
    n, em, ct = len(rows), sum(p["exact"] for p in parts), sum(p["contained"] for p in parts)
    return {"run": a.workdir, "data": path, "context": cfg.window, "items": n, "exact_match": em / n,
            "contains": ct / n, "exact": em, "contained": ct, "worst": gen.worst(rows, a.show), "rows": rows}


def _peers():
    """zoo.training.peers (this process's share of the items; every process's results on process 0), imported
    once jax may start."""
    from zoo.training import peers
    return peers


def _check_vocab(seqs, tok, cfg, workdir: str) -> None:
    """Ids the model has no row for would be read as some other token: refused."""
    top = max((max(s) for s in seqs if s), default=0)
    if top >= cfg.model.vocab_size:
        raise ValueError(f"the tokenizer {cfg.data.tokenizer!r} gives id {top}, beyond the {cfg.model.vocab_size} "
                         f"tokens of {workdir}'s model")


def main(argv=None) -> int:
    runtime.prepare_command()  # the compilation cache, XLA's log level: before jax starts
    from zoo import accel, distributed
    from zoo.errors import TrainError
    accel.configure()  # XLA's GPU flags, before anything starts jax's backend
    a = _parser().parse_intermixed_args(argv)  # RUN --task choice FILE: a positional after options
    try:  # arguments and paths are checked before jax is imported
        _check_args(a)
        several = distributed.wanted(a)
        if several:  # several processes: jax.distributed before any other jax call
            distributed.start(a)
        result = {"choice": choice, "generate": generate, "perplexity": perplexity, "classify": classify,
                  "tokens": tokens, "mlm": mlm, "translate": translate, "retrieval": retrieval}[a.task](a)
    except (*BAD_INPUT, distributed.DistributedError, TrainError) as e:
        return error(e)
    if result is None:  # not process 0: it prints the sums
        return 0
    if a.json:
        print(json.dumps({k: v for k, v in result.items() if k not in ("logliks", "rows")}), flush=True)
    else:
        print(table(result), flush=True)
    if several:  # process 0 holds the coordination service: the others end first
        distributed.linger()
    return 0


if __name__ == "__main__":
    sys.exit(main())
