"""Serve a decoder over HTTP, OpenAI's API: chat and text completions, streamed or not, batched continuously.

    zoo-serve runs/chat                                  # http://127.0.0.1:8000/v1, Ctrl-C (or SIGTERM) stops
    zoo-serve $GGUF --port 8080 --api-key sk-local       # any source zoo.load reads; every request needs the key
    python -c "import openai; c = openai.OpenAI(base_url='http://127.0.0.1:8000/v1', api_key='x'); \\
        print(c.chat.completions.create(model='chat', messages=[{'role': 'user', 'content': 'Hi'}]))"

SOURCE is a zoo run, a Hugging Face directory, a GGUF file or a PEFT adapter directory (whatever zoo.load reads); a
decoder, or a BERT-family encoder (all-MiniLM-L6-v2), which answers /v1/embeddings alone, or a cross-encoder (a bert_cls
model with one output), which answers /v1/rerank alone (an encoder-decoder is
refused in one line). A decoder answers /v1/embeddings too, with its last token's hidden state. The address is taken
first, so a port in use is one `error:` line before anything loads; the chat template is rendered once on a tiny
conversation before the server answers (a template that fails is one line, not a 500 for each chat request). Every
program is compiled before the server answers (the prefill of each prompt-length bucket and of a long prompt's
pieces, and the decode chunk: zoo.engine.batching), said in one line with how long it took. GET /metrics answers
Prometheus' text format, every response carries its request's X-Request-Id, and SIGTERM or Ctrl-C lets the requests
running finish for up to --shutdown-timeout seconds while new ones are answered 503 (zoo.serve.shutdown), then exits
0. Needs the serve extra: pip install -e '.[serve]' (FastAPI, uvicorn and prometheus_client).
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys

from zoo import runtime
from zoo.cli import BAD_INPUT, error


def main(argv=None) -> int:
    runtime.prepare_command()  # the compilation cache, XLA's log level: before jax starts
    ap = argparse.ArgumentParser(prog="zoo-serve", description=__doc__.split("\n")[0])
    ap.add_argument("source", help="a zoo run, Hugging Face directory, .gguf file or PEFT adapter (as zoo.load)")
    ap.add_argument("--host", default="127.0.0.1", help="the address to bind (default: %(default)s, this machine only)")
    ap.add_argument("--port", type=int, default=8000, help="(default: %(default)s)")
    ap.add_argument("--api-key", help="a key every request must send as 'Authorization: Bearer KEY' (default: none)")
    ap.add_argument("--model-id", help="the model's name in the API (default: the source's base name)")
    ap.add_argument("--adapter", action="append", default=[], metavar="NAME=PATH", help="a PEFT LoRA adapter of the "
                    "base served beside it: a request whose model is NAME runs it, rows of different adapters in one "
                    "batch (repeatable; zoo.engine.adapters)")
    ap.add_argument("--max-loras", type=int, help="adapter slots, room to load more over POST /v1/load_lora_adapter "
                    "(default: the adapters given, at least 4)")
    ap.add_argument("--max-lora-rank", type=int, help="the largest adapter rank the server holds (default: the "
                    "largest of the adapters given); a larger one is refused")
    ap.add_argument("--lora-targets", metavar="NAMES", help="layers the adapter table holds beside those of the "
                    "adapters given, for adapters loaded later: PEFT module names (q_proj,v_proj) or all")
    ap.add_argument("--slots", type=int, default=8, help="sequences decoded together (default: %(default)s)")
    ap.add_argument("--max-len", type=int, help="the KV cache's length, prompt and answer (default: the model's "
                                                "context, at most 2048)")
    ap.add_argument("--kv-cache-tokens", type=int, help="the KV cache's size in tokens, shared by the rows in pages of "
                    "16 (zoo.engine.pages): a request waits for pages when its prompt and max_tokens do not fit "
                    "(default: --slots x --max-len, every row able to fill the context at once)")
    ap.add_argument("--chunk", type=int, default=8, help="decode steps between two admissions of waiting requests "
                                                          "(default: %(default)s)")
    ap.add_argument("--max-queue", type=int, default=64, help="sequences that may wait; more are answered 429, and "
                                                               "a request for more than this 400 (default: %(default)s)")
    ap.add_argument("--max-request-bytes", type=int, default=8 << 20, help="the largest request body; larger ones are "
                                                                            "answered 413 (default: %(default)s, 8 MiB)")
    ap.add_argument("--max-prompts", type=int, default=256, help="prompts one /v1/completions request may hold; more "
                                                                  "are answered 413 (default: %(default)s)")
    ap.add_argument("--prefill-chunk", type=int, default=512, help="a prompt longer than this, arriving while others "
                    "decode, is prefilled this many tokens between two decode chunks (default: %(default)s)")
    ap.add_argument("--prefill-rows", type=int, default=8, help="the most new prompts prefilled together in one "
                    "program (a burst of short prompts costs about half as much); 1: each alone "
                    "(default: %(default)s)")
    ap.add_argument("--no-prefix-cache", action="store_true", help="prefill every prompt whole, even where another "
                    "row holds its leading tokens (a shared system prompt) already")
    ap.add_argument("--paged-kernel", default="auto", choices=("auto", "off", "tpu", "cpu"), help="a decoding "
                    "step's attention by a kernel reading each row's pages where they lie: auto, jax's Pallas ragged "
                    "paged-attention kernel on a TPU (head dim 128) and zoo's C++ kernel on a CPU (float32; built "
                    "with the system's C++ compiler on first use), where it takes the model (zoo.nn.paged_kernels "
                    "says why not); off: the rows' pages gathered; tpu, cpu: that kernel or a one-line refusal")
    ap.add_argument("--scan-layers", action="store_true", help="decode with the layers as one scan: each program "
                    "compiles one layer (a start-up 2-3x faster) but every step copies each layer's weights out of "
                    "their stack (1.3-1.5x slower decoding)")
    ap.add_argument("--shutdown-timeout", type=float, default=30.0, help="at SIGTERM or Ctrl-C, seconds the requests "
                    "running may take to finish while new ones are answered 503; those left then are cut (default: "
                    "%(default)g; a second signal cuts them at once)")
    ap.add_argument("--log-requests", action="store_true", help="a line per request on stderr: its id, method, path, "
                    "status and seconds")
    ap.add_argument("--compile-for", metavar="TARGET", help="compile the engine's programs (decode chunk, prefill) for a "
                    "TPU topology (v5e:2x2, v5e-8, ...) and print the report instead of serving: does it fit a chip? "
                    "SOURCE: a preset name or a zoo run; nothing loaded (needs libtpu: pip install -e '.[tpu]')")
    ap.add_argument("--dtype", default="bfloat16", help="with --compile-for: the params' and compute dtype "
                                                        "(default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="with --compile-for: the report as one JSON object")
    a = ap.parse_args(argv)
    if a.json and not a.compile_for:
        ap.error("--json goes with --compile-for TARGET")
    sock = None
    try:
        for flag, v in (("--slots", a.slots), ("--chunk", a.chunk), ("--max-queue", a.max_queue),
                        ("--prefill-chunk", a.prefill_chunk), ("--prefill-rows", a.prefill_rows),
                        ("--max-request-bytes", a.max_request_bytes), ("--max-prompts", a.max_prompts),
                        ("--max-len", a.max_len if a.max_len is not None else 2),
                        ("--kv-cache-tokens", a.kv_cache_tokens if a.kv_cache_tokens is not None else 1)):
            if v < 1 or (flag == "--max-len" and v < 2):
                raise ValueError(f"{flag} {v} must be >= {2 if flag == '--max-len' else 1}")
        named = _adapters(a.adapter)
        lora = bool(named or a.lora_targets)
        for flag, v in (("--max-loras", a.max_loras), ("--max-lora-rank", a.max_lora_rank)):
            if v is not None and (v < 1 or not lora):
                raise ValueError(f"{flag} {v} must be >= 1" if lora else f"{flag} goes with --adapter NAME=PATH or "
                                                                         f"--lora-targets")
        if not 0 < a.port < 65536:
            raise ValueError(f"--port {a.port} must be from 1 to 65535")
        if not a.shutdown_timeout >= 0:
            raise ValueError(f"--shutdown-timeout {a.shutdown_timeout:g} must be >= 0 (seconds)")
        if a.compile_for:
            return _compile_for(a)
        try:
            import fastapi  # noqa: F401
            import prometheus_client  # noqa: F401
            import uvicorn
        except ImportError:
            raise ValueError("zoo-serve needs FastAPI, uvicorn and prometheus_client: pip install -e '.[serve]'") \
                from None
        sock = bind(a.host, a.port)  # before loading: a port in use costs no load and no compile
        import zoo
        from zoo.api import decoder
        from zoo.serve.app import create_app
        from zoo.engine.adapters import AdapterTable
        from zoo.engine import pages
        from zoo.engine.batching import Engine
        lm = zoo.load(a.source)
        if lm.config.model.family == "bert" and lora:
            raise ValueError(f"--adapter serves a decoder's LoRA adapters; {a.source!r} is an encoder")
        if lm.config.model.family == "bert":  # an embedding model: /v1/embeddings alone, no engine
            return _serve_encoder(a, lm, sock, uvicorn)
        decoder.require_decoder(lm, "serve")
        decoder.prompt_tokens(lm, conversations=[[{"role": "user", "content": "Hi"}]])  # the chat template renders
        model_id = a.model_id or os.path.basename(os.path.normpath(a.source))
        if model_id in named:
            raise ValueError(f"--adapter {model_id}=...: {model_id!r} is the base's name (--model-id); name it "
                             f"otherwise")
        table = AdapterTable.build(lm, named, a.max_loras, a.max_lora_rank, a.lora_targets) if lora else None
        engine = Engine(lm, slots=a.slots, max_len=a.max_len or min(lm.config.window, 2048), chunk=a.chunk,
                        max_queue=a.max_queue, prefix_cache=not a.no_prefix_cache, prefill_chunk=a.prefill_chunk,
                        scan_layers=a.scan_layers, prefill_rows=a.prefill_rows, adapters=table,
                        kv_pages=a.kv_cache_tokens and pages.pages_of_tokens(a.kv_cache_tokens),
                        paged_kernel=a.paged_kernel)
    except BAD_INPUT as e:
        if sock is not None:
            sock.close()
        return error(e)
    seconds = engine.warm(say=lambda line: print(line, flush=True))
    if table is not None:
        print(f"adapters: {', '.join(table.names) or 'none yet'} ({table.slots} slots of rank {table.rank}, "
              f"{len(table.shapes)} layers)", flush=True)
    print(f"serving {model_id} on http://{a.host}:{a.port}/v1 ({a.slots} slots, context {engine.max_len}, KV cache "
          f"{(engine.book.pages - 1) * pages.PAGE} tokens in pages of {pages.PAGE}; "
          f"{engine.programs()} programs compiled in {seconds:.1f} s; {attention_of(engine)}); Ctrl-C stops",
          flush=True)
    engine.start()
    engine.compile_stored_later()  # in threads, while it serves (its /health lists them until they are in)
    app = create_app(engine, model_id=model_id, api_key=a.api_key, max_request_bytes=a.max_request_bytes,
                     max_prompts=a.max_prompts, log_requests=a.log_requests)
    try:
        _run(a, app, sock, uvicorn)
    finally:
        engine.stop()
    print("stopped", flush=True)
    return 0


def attention_of(engine) -> str:
    """How a decoding step attends, for the start-up line."""
    kernels = {"cpu": "zoo's CPU kernel", "tpu": "jax's ragged paged-attention kernel"}
    return f"attention by {kernels[engine.kernel]}" if engine.kernel else "attention over the gathered pages"


def _adapters(given: list[str]) -> dict:
    """--adapter NAME=PATH, each given once: {name: path}; a ValueError naming the one malformed."""
    out = {}
    for item in given:
        name, eq, path = item.partition("=")
        if not eq or not name or not path:
            raise ValueError(f"--adapter {item!r}: give NAME=PATH (a name for requests' model, a PEFT adapter "
                             f"directory)")
        if name in out:
            raise ValueError(f"--adapter {name}=... is given twice")
        out[name] = path
    return out


def _run(a, app, sock, uvicorn) -> None:
    """uvicorn serving `app` on `sock` until a signal, then stopping gracefully (zoo.serve.shutdown); uvicorn's own
    wait for connections is 1 s, after the requests' own --shutdown-timeout."""
    from zoo.serve import shutdown
    config = uvicorn.Config(app, host=a.host, port=a.port, log_level="warning", timeout_graceful_shutdown=1)
    shutdown.run(shutdown.Server(config, app.state.drain, a.shutdown_timeout), sock)


def _serve_encoder(a, lm, sock, uvicorn) -> int:
    """An encoder (all-MiniLM-L6-v2, any BERT-family checkpoint) served for /v1/embeddings, or a cross-encoder for
    /v1/rerank; its first batch compiled before the port answers."""
    from zoo.serve.app import create_app
    from zoo.serve.rerank import is_cross_encoder
    model_id = a.model_id or os.path.basename(os.path.normpath(a.source))
    if is_cross_encoder(lm):  # a reranker: /v1/rerank alone
        lm.rerank("warm", ["warm"])
        what = "rerank, a cross-encoder"
    else:
        lm.embed(["warm"])
        what = f"embeddings, {lm.model.cfg.d_model} dimensions"
    print(f"serving {model_id} on http://{a.host}:{a.port}/v1 ({what}); Ctrl-C stops", flush=True)
    app = create_app(None, lm=lm, model_id=model_id, api_key=a.api_key, max_request_bytes=a.max_request_bytes,
                     max_prompts=a.max_prompts, log_requests=a.log_requests)
    _run(a, app, sock, uvicorn)
    print("stopped", flush=True)
    return 0


def _compile_for(a) -> int:
    """--compile-for TARGET: the engine's programs compiled for TARGET (zoo.aot.serve), nothing loaded or served."""
    import json
    from zoo.aot import report, serve
    out = serve.compile_serve(a.source, a.compile_for, slots=a.slots, max_len=a.max_len, chunk=a.chunk,
                              dtype=a.dtype, paged_kernel=a.paged_kernel,
                              scan_layers=a.scan_layers)
    print(json.dumps(out) if a.json else report.text(out))
    return 0


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port) as uvicorn binds one (SO_REUSEADDR), handed to it later; a ValueError naming
    the address if it is taken or cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except (socket.gaierror, UnicodeError) as e:
        sock.close()
        raise ValueError(f"--host {host!r} is not an address of this machine ({e})") from None
    except OSError as e:
        sock.close()
        why = "is in use (another server?); give another --port" if e.errno == errno.EADDRINUSE else \
            f"cannot be bound ({e.strerror or e})"
        raise ValueError(f"{host}:{port} {why}") from None
    return sock


if __name__ == "__main__":
    sys.exit(main())
