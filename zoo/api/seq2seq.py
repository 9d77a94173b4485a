"""Text in, text out, for an encoder-decoder (T5, BART, zoo's own): what Pretrained.translate does and
zoo-translate calls. Inputs are framed as the run frames them (a converted checkpoint: its own framing,
zoo.tasks.seq2seq_data.Framing) and decode in one batch, greedy (beam 1) or with beam search ranked and stopped
as the run says (zoo: GNMT alpha 0.6; a converted T5 or BART: as transformers' generate, with the checkpoint's
length_penalty and early_stopping): zoo.infer.decoding."""

from __future__ import annotations

from zoo.errors import ArgumentError, FamilyError


def translate(lm, texts, *, beam: int = 4, length_penalty: float | None = None, max_len: int | None = None):
    """See Pretrained.translate."""
    from zoo.api.decoder import texts_of
    from zoo.infer import decoding
    from zoo.tasks.seq2seq_data import check_framing, encode_sources
    if lm.config.model.family != "encdec":
        raise FamilyError(f".translate needs an encoder-decoder; {lm.source!r} is a {lm.config.model.family} model "
                          f"(task {lm.config.task}), which offers {', '.join(lm.offers())}")
    items, single = texts_of(texts, "texts")
    if isinstance(beam, bool) or not isinstance(beam, int) or beam < 1:
        raise ArgumentError(f"beam={beam!r} must be a whole number >= 1 (1: greedy)")
    if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1):
        raise ArgumentError(f"max_len={max_len!r} must be a whole number >= 1 (None: the run's data.seq_len)")
    cfg, tok = lm.config, lm.tokenizer
    sp = check_framing(cfg.model, tok)
    src_BS, valid_BS = encode_sources(tok, items, cfg.data.seq_len, sp)
    out = decoding.generate(lm.model, lm.params, src_BS, valid_BS, max_len=max_len or cfg.data.seq_len,
                            bos_id=sp.decoder_start, eos_id=sp.eos, vocab_limit=tok.n_vocab, beam=beam,
                            length_penalty=sp.length_penalty if length_penalty is None else length_penalty,
                            style=sp.beam_style, early_stopping=sp.early_stopping)
    decoded = [tok.decode(ids) for ids in out]
    return decoded[0] if single else decoded
