"""A Hugging Face checkpoint's GPT-2 byte-level BPE as a tiktoken encoding with the checkpoint's own ids
(`RemappedBpe`, built from vocab.json + merges.txt by zoo.data.hf_tokenizers.gpt2_bpe), and GPT-2's printable
stand-ins of the bytes (`unicode_to_byte`, which zoo.hf.tokenizer_export writes back)."""

from __future__ import annotations

import numpy as np

from zoo.data.bpe import ENDOFTEXT, TiktokenTokenizer


def unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: the printable stand-in character of each byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class RemappedBpe(TiktokenTokenizer):
    """tiktoken BPE whose ranks follow merges.txt; ids are the checkpoint's vocabulary ids.

    tiktoken merges by the rank of the merged bytes, Hugging Face by the merge's line in
    merges.txt: ranks = 256 + line number reproduce it. The two numberings coincide for GPT-2's
    own files; a tokenizer trained elsewhere (special tokens first, say) needs the id table.
    """

    def __init__(self, encoding, rank_to_id: np.ndarray, n_vocab: int, eot: int, name: str, fingerprint: str,
                 eot_text: str = ENDOFTEXT):
        super().__init__(encoding, name=name, fingerprint=fingerprint)
        self.rank_to_id = rank_to_id
        self.id_to_rank = {int(i): r for r, i in enumerate(rank_to_id) if i >= 0}
        self.n_vocab, self.eot_token, self.eot_text = n_vocab, eot, eot_text
        self.eot_rank = encoding.encode_single_token(eot_text)  # a special of the encoding (gpt2_bpe)

    def encode(self, text: str) -> list[int]:
        return self.rank_to_id[self.encoding.encode(text, disallowed_special=())].tolist()

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.rank_to_id[r].tolist() for r in self.encoding.encode_batch(list(texts), disallowed_special=())]

    def _ids(self, ranks: list[int]) -> list[int]:
        # eot_text's rank maps to -1 where it decodes to nothing (BART's </s>); its id is still eot_token.
        return [self.eot_token if r == self.eot_rank else int(self.rank_to_id[r]) for r in ranks]

    def decode(self, ids) -> str:
        return self.encoding.decode([self.id_to_rank[int(i)] for i in ids if int(i) in self.id_to_rank])
