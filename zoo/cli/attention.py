"""Draw a trained run's attention weights as heat maps, one panel per head, and say what each head does.

    zoo-attention runs/shakespeare --text "O Romeo, Romeo! wherefore art thou Romeo?" --out attention.png
    zoo-attention runs/mlm --text 'The "wh[MASK]le" statement is used for repeated execution' --layer 1
    zoo-attention runs/s2s --text "a tiny model reverses words" --kind cross --out cross.png

The weights are the model's own softmax rows (zoo.infer.attention): GPT's causal self-attention; BERT's
bidirectional self-attention over [CLS] text [SEP]; the encoder-decoder's encoder self-, decoder self-
and cross-attention, the decoder reading the run's greedy output for the text (or --target). Rows are
queries, columns keys; a cross-attention row is labelled with the token the decoder predicts there.
Per head, one line measured on the text: the mean weight on the previous token, the first token and
itself, and the mean distance attended, in tokens (a cross-attention head: the weight on the first
source token and the mean largest weight); a head that puts half its weight or more in one of those
places is named (previous-token head, first-token head, self head): the positional heads.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from zoo import runtime
from zoo.cli import BAD_INPUT, error

KINDS = ("self", "encoder", "decoder", "cross")  # zoo.infer.attention.KINDS (imported only after parsing)
SHOWN = {" ": "␣", "\n": "↵", "\t": "⇥"}  # whitespace tokens, drawn visibly


def label(tokenizer, i: int, specials: dict[int, str]) -> str:
    if i in specials:
        return specials[i]
    text = tokenizer.decode([i])
    return "".join(SHOWN.get(c, c) for c in text) or "?"


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def checked_length(ids: list[int], seq_len: int) -> list[int]:
    if len(ids) > seq_len:
        raise ValueError(f"--text is {len(ids)} tokens, more than the run's data.seq_len={seq_len} it trained on; "
                         f"shorten it")
    return ids


def gpt_maps(model, params, tok, cfg, text: str):
    """[(Weights, rows, cols)] of a GPT run: one token sequence, causal."""
    import numpy as np
    from zoo.infer.attention import attention_weights
    ids = checked_length(tok.encode(text), cfg.data.seq_len)
    _, maps = attention_weights(model, params, np.asarray([ids], np.int32))
    labels = [label(tok, i, {}) for i in ids]
    return [(m, labels, labels) for m in maps]


def bert_maps(model, params, tok, cfg, text: str):
    """[CLS] text [SEP] ("[MASK]" in the text is the mask token), one segment, no padding."""
    import numpy as np
    from zoo.infer.attention import attention_weights
    from zoo.tasks.mlm import SPECIALS, bert_specials, encode_masked
    sp = bert_specials(tok)
    ids = checked_length(encode_masked(text, tok, sp), cfg.data.seq_len)
    ids_1T = np.asarray([ids], np.int32)
    _, maps = attention_weights(model, params, ids_1T, np.zeros_like(ids_1T), np.ones(ids_1T.shape, bool))
    specials = dict(zip((sp.cls, sp.sep, sp.mask, sp.pad), SPECIALS))
    labels = [label(tok, i, specials) for i in ids]
    return [(m, labels, labels) for m in maps]


def encdec_maps(model, params, tok, cfg, text: str, target: str | None):
    """The source, and the target (the run's greedy output unless given) teacher-forced through the decoder."""
    import numpy as np
    from zoo.infer import decoding
    from zoo.infer.attention import attention_weights
    from zoo.tasks.seq2seq_data import check_framing, encode_sources
    sp = check_framing(cfg.model, tok)
    src_1S, valid_1S = encode_sources(tok, [text], cfg.data.seq_len, sp)
    if target is None:
        out = decoding.generate(model, params, src_1S, valid_1S, max_len=cfg.data.seq_len, bos_id=sp.decoder_start,
                                eos_id=sp.eos, vocab_limit=tok.n_vocab)[0]
    else:
        out = tok.encode(target)
    tgt = sp.target(out)[:cfg.data.seq_len]  # what the decoder predicts, EOS included
    tgt_in = [sp.decoder_start, *tgt[:-1]]
    _, maps = attention_weights(model, params, src_1S, valid_1S, np.asarray([tgt_in], np.int32))
    S = int(valid_1S.sum())
    specials = {sp.pad: "<pad>", sp.eos: "</s>"}
    specials.setdefault(sp.decoder_start, "<s>")  # zoo's own BOS; T5 starts from <pad>, BART from </s>
    src = [label(tok, i, specials) for i in src_1S[0, :S]]
    dec_in, dec_out = ([label(tok, i, specials) for i in ids] for ids in (tgt_in, tgt))
    axes = {"encoder": (src, src), "decoder": (dec_in, dec_in), "cross": (dec_out, src)}
    crop = {"encoder": (S, S), "decoder": (None, None), "cross": (None, S)}
    out_maps = []
    for m in maps:  # the padded source positions are left out of the pictures (their weights are 0)
        t, s = crop[m.kind]
        out_maps.append((dataclasses.replace(m, w_BNTS=m.w_BNTS[:, :, :t, :s]), *axes[m.kind]))
    return out_maps


def select(maps, kind: str | None, layer: int | None, head: int | None, family: str):
    """The (Weights, rows, cols) and heads asked for; a kind, layer or head the run lacks is refused."""
    kinds = list(dict.fromkeys(m.kind for m, _, _ in maps))
    if kind is not None and kind not in kinds:
        raise ValueError(f"--kind {kind}: a {family} run has {', '.join(kinds)}")
    maps = [x for x in maps if kind is None or x[0].kind == kind]
    layers = sorted({m.layer for m, _, _ in maps})
    if layer is not None and layer not in layers:
        raise ValueError(f"--layer {layer} is not a layer of this run; choose {layers[0]}..{layers[-1]}")
    maps = [x for x in maps if layer is None or x[0].layer == layer]
    n_heads = maps[0][0].w_BNTS.shape[1]
    if head is not None and not 0 <= head < n_heads:
        raise ValueError(f"--head {head} is not a head of this run; choose 0..{n_heads - 1}")
    return maps, [head] if head is not None else list(range(n_heads))


def report(maps, heads):
    """(a line per head, a row of panels per attention layer): each head's stats, and its name if positional."""
    from zoo.infer.attention import KINDS as NAMES, Panel, describe, head_stats, role
    lines, grid = [], []
    for m, rows, cols in maps:
        name = NAMES[m.kind]
        grid.append([])
        for h in heads:
            w_TS = m.w_BNTS[0, h]
            stats = head_stats(w_TS, self_attention=m.kind != "cross")
            tag = role(stats)
            lines.append(f"{name} layer {m.layer} head {h}: {describe(stats)}" + (f"  <- {tag}" if tag else ""))
            grid[-1].append(Panel(f"{name}, layer {m.layer}, head {h}" + (f"\n{tag}" if tag else ""), w_TS,
                                  rows, cols))
    return lines, grid


def main(argv=None) -> int:
    runtime.prepare_command()  # the compilation cache, XLA's log level: before jax starts
    ap = argparse.ArgumentParser(prog="zoo-attention", description=__doc__.split("\n")[0])
    ap.add_argument("workdir", help="a run directory with checkpoints (GPT, BERT or encoder-decoder)")
    ap.add_argument("--text", required=True, help="the text the model reads (the encoder-decoder's source)")
    ap.add_argument("--target", default=None,
                    help="encoder-decoder: the decoder's text (default: the run's greedy output for --text)")
    ap.add_argument("--kind", choices=KINDS, default=None,
                    help="only this attention: self (GPT, BERT), encoder, decoder or cross (default: every one)")
    ap.add_argument("--layer", type=int, default=None, help="only this layer, counted from 0 (default: every one)")
    ap.add_argument("--head", type=int, default=None, help="only this head, counted from 0 (default: every one)")
    ap.add_argument("--out", default="attention.png", help="the PNG to write (default: %(default)s)")
    a = ap.parse_args(argv)
    from zoo.infer.attention import draw
    from zoo.training.runs import load_run
    try:
        if not a.text:
            raise ValueError("--text is empty")
        model, params, tok, cfg = load_run(a.workdir)
        family = cfg.model.family
        if a.target is not None and family != "encdec":
            raise ValueError(f"--target is the decoder's text of an encoder-decoder run; {a.workdir!r} is a {family} run")
        if family == "encdec":
            maps = encdec_maps(model, params, tok, cfg, a.text, a.target)
        else:
            maps = (gpt_maps if family == "gpt" else bert_maps)(model, params, tok, cfg, a.text)
        maps, heads = select(maps, a.kind, a.layer, a.head, family)
        lines, grid = report(maps, heads)
        n = draw(grid, a.out, title=f"{a.workdir}: {a.text[:80]}")
    except (*BAD_INPUT, OSError) as e:
        return error(e)
    print("\n".join(lines))
    print(f"wrote {a.out}: {plural(n, 'panel')}, {plural(len(grid), 'attention layer')} x {plural(len(heads), 'head')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
