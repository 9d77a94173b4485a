"""Embed texts with a sentence-embedding checkpoint (all-MiniLM-L6-v2, any BERT-family encoder or decoder).

    zoo-embed MODEL --file texts.jsonl --out vectors.npy       # {"text": ...} a line (or .txt, one a line)
    zoo-embed MODEL --file queries.txt --prompt-name query --out queries.jsonl
    zoo-embed MODEL --text "How do I read a file?"             # one vector, printed as a JSON line

MODEL is what zoo.load takes: a sentence-transformers or Hugging Face directory, a zoo run, a GGUF file. A shell
over Pretrained.embed (zoo.api.embed): pooled and normalised as the checkpoint's sentence-transformers files say,
equal to SentenceTransformer.encode on the same checkpoint. --out PATH.npy writes float32 [N, D] in the file's
order (blank lines skipped); --out PATH.jsonl (or stdout) one {"text": ..., "embedding": [...]} a line. A file is
written whole or not at all (a temporary file renamed), so an interrupted run leaves an earlier output intact.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from zoo import runtime
from zoo.cli import BAD_INPUT, error

OUTPUTS = (".npy", ".jsonl")


def write(path: str | None, texts: list[str], vectors: np.ndarray) -> None:
    """vectors to `path` (.npy or .jsonl; JSON lines on stdout when None), through a temporary file."""
    if path is None:
        for t, v in zip(texts, vectors):
            sys.stdout.write(json.dumps({"text": t, "embedding": v.tolist()}, ensure_ascii=False) + "\n")
        return
    tmp = path + ".tmp"
    try:
        if path.endswith(".npy"):
            with open(tmp, "wb") as f:
                np.save(f, vectors)
        else:
            with open(tmp, "w", encoding="utf-8") as f:
                for t, v in zip(texts, vectors):
                    f.write(json.dumps({"text": t, "embedding": v.tolist()}, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        raise ValueError(f"--out={path!r}: writing it failed ({e.strerror or e})") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def main(argv=None) -> int:
    runtime.prepare_command()  # the compilation cache, XLA's log level: before jax starts
    ap = argparse.ArgumentParser(prog="zoo-embed", description=__doc__.split("\n")[0])
    ap.add_argument("model", help="what zoo.load takes: a sentence-transformers or HF directory, a zoo run, a .gguf")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="one text to embed")
    src.add_argument("--file", metavar="PATH", help='texts: .txt (one a line) or .jsonl ({"text": ...} a line)')
    ap.add_argument("--out", metavar="PATH", help="a .npy (float32 [N, D]) or .jsonl file (default: JSON lines on "
                                                  "stdout)")
    ap.add_argument("--batch-size", type=int, default=32, metavar="N", help="texts per batch (default: %(default)s)")
    ap.add_argument("--prompt", help="a string put before every text (e.g. an instruction for queries)")
    ap.add_argument("--prompt-name", help="one of the checkpoint's named prompts "
                                          "(config_sentence_transformers.json), e.g. query")
    norm = ap.add_mutually_exclusive_group()
    norm.add_argument("--normalize", dest="normalize", action="store_true", default=None,
                      help="L2-normalise every vector (default: as the checkpoint's modules.json says)")
    norm.add_argument("--no-normalize", dest="normalize", action="store_false")
    a = ap.parse_args(argv)
    from zoo.cli import inputs
    try:
        if a.out is not None and os.path.splitext(a.out)[1].lower() not in OUTPUTS:
            raise ValueError(f"--out={a.out!r}: write a {' or a '.join(OUTPUTS)} file")
        if a.batch_size < 1:
            raise ValueError(f"--batch-size={a.batch_size} must be >= 1")
        texts = [line.text for line in inputs.read_lines(a.file)] if a.file is not None else [a.text]
        inputs.check_out(a.out)
        import zoo
        lm = zoo.load(a.model)
        vectors = lm.embed(texts, batch_size=a.batch_size, normalize=a.normalize, prompt=a.prompt,
                           prompt_name=a.prompt_name)
        write(a.out, texts, vectors)
    except BAD_INPUT as e:
        return error(e)
    if a.out is not None:
        print(f"{len(texts)} texts -> {a.out} ({vectors.shape[1]} dimensions)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
