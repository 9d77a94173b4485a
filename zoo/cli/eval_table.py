"""zoo-eval's printed report of one evaluation's result (zoo.cli.eval prints it; --json prints the dict itself)."""

from __future__ import annotations


def table(r: dict) -> str:
    """What zoo-eval prints for a result (without --json): a header naming the run, the data and how it was scored,
    then the metrics of its kind (token classification, masked LM, translation, classification, generation,
    multiple choice or perplexity) and, where the kind has them, the worst rows."""
    if "ndcg@10" in r:
        rows = [("queries", f"{r['queries']:,}"), ("documents", f"{r['documents']:,}")]
        rows += [(k, f"{v:.4f}") for k, v in r.items() if "@" in k]
        return "\n".join([f"{r['run']} on {r['data']} (retrieval, split {r['split']}, "
                          f"{r.get('search', 'exact cosine search')})",
                          *(f"  {k:<11}{v}" for k, v in rows)])
    if "per_type" in r:
        lines = [f"{r['run']} on {r['data']} (token classification, {r['examples']:,} examples, {r['words']:,} "
                 f"words, {r['truncated']} truncated)",
                 f"  {'entity':<10}{'precision':>10}{'recall':>10}{'F1':>10}{'support':>10}",
                 *(f"  {t:<10}{s['precision']:>10.4f}{s['recall']:>10.4f}{s['f1']:>10.4f}{s['support']:>10,}"
                   for t, s in r["per_type"].items()),
                 f"  {'all':<10}{r['precision']:>10.4f}{r['recall']:>10.4f}{r['f1']:>10.4f}"
                 f"{sum(s['support'] for s in r['per_type'].values()):>10,}",
                 f"  word accuracy {r['accuracy']:.4f}"]
        return "\n".join(lines)
    if "mlm_accuracy" in r:
        rows = [("documents", f"{r['documents']:,}"), ("tokens", f"{r['tokens']:,}"), ("masked", f"{r['masked']:,}"),
                ("accuracy", f"{r['mlm_accuracy']:.4f}"), ("loss", f"{r['mlm_loss']:.4f}"),
                ("perplexity", f"{r['perplexity']:.4f}")]
        return "\n".join([f"{r['run']} on {r['data']} (masked tokens, pseudo-accuracy)",
                          *(f"  {k:<11}{v}" for k, v in rows)])
    if "bleu" in r:
        how = "greedy" if r["beam"] == 1 else f"beam {r['beam']}"
        lines = [f"{r['run']} on {r['data']} ({how}, {r['examples']:,} pairs, {r['truncated']} sources truncated)",
                 f"  {'BLEU':<12}{r['bleu']:.2f}", f"  {'exact match':<12}{r['exact_match']:.4f}"]
        if r["worst"]:
            lines.append("worst rows (lowest chrF first):")
            lines += [f"  {w['source'][:80]!r}: expected {w['target'][:80]!r}, got {w['output'][:80]!r}"
                      for w in r["worst"]]
        return "\n".join(lines)
    if "confusion" in r:
        width = max(len(c) for c in r["classes"]) + 2
        lines = [f"{r['run']} on {r['data']} (classification, {r['examples']:,} examples, {r['truncated']} truncated)",
                 f"  {'accuracy':<10}{r['accuracy']:.4f}", f"  {'macro-F1':<10}{r['macro_f1']:.4f}",
                 "confusion (rows: true, columns: predicted):",
                 " " * width + "".join(f"{c:>{width}}" for c in r["classes"])]
        lines += [f"{c:>{width}}" + "".join(f"{n:>{width}}" for n in row)
                  for c, row in zip(r["classes"], r["confusion"])]
        return "\n".join(lines)
    if "items" in r:
        lines = [f"{r['run']} on {r['data']} (greedy answers, context {r['context']})",
                 f"  {'items':<14}{r['items']:,}",
                 f"  {'exact match':<14}{r['exact_match']:.4f}  ({r['exact']}/{r['items']})",
                 f"  {'contains':<14}{r['contains']:.4f}  ({r['contained']}/{r['items']})"]
        if r["worst"]:
            lines.append("worst rows (no expected answer contained first):")
            lines += [f"  #{w['index']}: expected {w['expected']!r}, got {w['answer'][:200]!r}" for w in r["worst"]]
        return "\n".join(lines)
    if "questions" in r:
        rows = [("questions", f"{r['questions']:,}"), ("acc", f"{r['acc']:.4f}  ({r['correct']}/{r['questions']})"),
                ("acc_norm", f"{r['acc_norm']:.4f}  ({r['correct_norm']}/{r['questions']})")]
        head = f"{r['run']} on {r['data']} (multiple choice, context {r['context']})"
    else:
        rows = [("documents", f"{r['documents']:,}"), ("tokens", f"{r['tokens']:,}"), ("bytes", f"{r['bytes']:,}"),
                ("NLL/token", f"{r['nll_per_token']:.4f}"), ("perplexity", f"{r['perplexity']:.4f}"),
                ("bits/byte", f"{r['bits_per_byte']:.4f}")]
        head = f"{r['run']} on {r['data']} (context {r['context']}, stride {r['stride']})"
    return "\n".join([head, *(f"  {k:<11}{v}" for k, v in rows)])
