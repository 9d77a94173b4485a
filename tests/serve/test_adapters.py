"""zoo-serve's adapters per request (zoo.engine.adapters, zoo.serve.adapters) on llama_tiny with PEFT adapters made
here (random A and nonzero B, targets that differ): rows of two adapters and the base decode in one batch, each
adapter's greedy answer that of the adapter merged and served alone (zoo.load of its directory); /v1/models lists
them; a request's `model` picks one (another name is a 404 listing the served ones); adapters load into a free slot
over the admin route (with the key, without compiling) and unload; an adapter of another base, a rank above the
table's, a server without a key and a malformed --adapter are refused in one line."""

import json
import os
import queue
import types

import numpy as np
import pytest
from safetensors.numpy import save_file
from starlette.testclient import TestClient

import zoo
from zoo.cli import serve as serve_cli
from zoo.engine import pages
from zoo.engine.adapters import AdapterTable, InUse, read
from zoo.errors import ArgumentError
from zoo.engine.batching import Engine, Sequence

KEY = "sk-adapters"
ENGINE = dict(slots=4, max_len=128, chunk=4, prefill_rows=1)  # every engine here: the same buckets


def make_adapter(path, lm, targets: list[str], rank: int, seed: int, wrong_in: bool = False) -> str:
    """A PEFT LoRA adapter directory for `lm` (base_model_name_or_path its preset name): every layer whose module
    name ends in one of `targets`, A and B random (B nonzero, so the adapter changes the answers); `wrong_in`: A's
    input one wider than the base's (an adapter of another base)."""
    from zoo.hf import peft
    sites = peft.layers(lm.config, rank)[0]
    rng, tensors = np.random.default_rng(seed), {}
    for m, s in sites.items():
        if m.rsplit(".", 1)[-1] in targets:
            fan_in = int(np.prod(s.a[:-1])) + wrong_in
            tensors[f"{peft.PREFIX}{m}.lora_A.weight"] = rng.normal(0, 0.3, (rank, fan_in)).astype(np.float32)
            tensors[f"{peft.PREFIX}{m}.lora_B.weight"] = rng.normal(
                0, 0.3, (len(s.einsums) * int(np.prod(s.b[1:])), rank)).astype(np.float32)
    os.makedirs(path)
    save_file(tensors, os.path.join(path, peft.WEIGHTS))
    with open(os.path.join(path, peft.CONFIG), "w") as f:
        json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank,
                   "target_modules": targets, "base_model_name_or_path": "llama_tiny"}, f)
    return str(path)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(base lm, {name: adapter dir}, the multi-adapter engine, prompts)."""
    root = tmp_path_factory.mktemp("adapters")
    lm = zoo.load("llama_tiny")
    dirs = {"a": make_adapter(root / "a", lm, ["q_proj", "v_proj"], 4, 1),
            "b": make_adapter(root / "b", lm, ["q_proj", "down_proj"], 2, 2),  # another rank and targets
            "wide": make_adapter(root / "wide", lm, ["q_proj"], 8, 3),  # rank 8: above the table's 4
            "other": make_adapter(root / "other", lm, ["q_proj"], 2, 4, wrong_in=True)}
    table = AdapterTable.build(lm, {"a": dirs["a"], "b": dirs["b"]}, slots=3)
    engine = Engine(lm, adapters=table, **ENGINE)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 256, n).tolist() for n in (20, 27)]
    yield lm, dirs, engine, prompts
    engine.stop()


def greedy(engine, jobs: list[tuple[list[int], int]], max_tokens: int = 10) -> list[list[int]]:
    """Each (prompt, adapter slot)'s greedy tokens on `engine` (on this thread: its loop's steps, all submitted
    together, so they decode in one batch)."""
    got = [[] for _ in jobs]
    seqs = [Sequence(prompt=p, max_tokens=max_tokens, temperature=0.0, adapter=slot,
                     emit=lambda ids, end, i=i: got[i].extend(ids)) for i, (p, slot) in enumerate(jobs)]
    engine.run(seqs)
    return got


def test_rows_of_two_adapters_and_the_base_decode_in_one_batch_as_each_merged_alone(setup):
    lm, dirs, engine, prompts = setup
    mixes, decode = [], engine._decode

    def spy(*a, **kw):  # the adapters of the rows live in each decode call
        mixes.append({r.adapter for r in engine.rows if r is not None})
        return decode(*a, **kw)
    engine._decode = spy
    slots = engine.adapters.names
    jobs = [(prompts[0], 0), (prompts[0], slots["a"]), (prompts[1], slots["b"]), (prompts[1], slots["a"])]
    try:
        got = greedy(engine, jobs)
    finally:
        engine._decode = decode
    assert {0, 1, 2} in mixes  # one program call decoded rows of both adapters and the base
    # a stored prefix serves its own adapter's prompts only: its keys and values are that adapter's
    turn = prompts[1] + got[2] + [7]  # (prompts[1], b)'s prompt and answer, stored when it ended
    assert engine.shared(turn, slots["b"])[0] == len(turn[:-1]) // 16 * 16 >= 32
    assert engine.shared(turn, 0) == (0, [])  # the base never ran it
    want, alone = {}, Engine(lm, **{**ENGINE, "prefix_cache": False})
    for s, src in ((0, lm), (slots["a"], zoo.load(dirs["a"])), (slots["b"], zoo.load(dirs["b"]))):
        alone.params = src.decoding(scan=False)[1]  # the base, or an adapter merged into it (zoo.load of its
        want[s] = dict(zip(map(tuple, prompts), greedy(alone, [(p, 0) for p in prompts])))  # directory), alone
    for (p, s), tokens in zip(jobs, got):
        assert tokens == want[s][tuple(p)], s
        assert s == 0 or tokens != want[0][tuple(p)], "an adapter that changes nothing tests nothing"


@pytest.fixture(scope="module")
def http(setup):
    from zoo.serve.app import create_app
    _, _, engine, _ = setup
    engine.start()
    return TestClient(create_app(engine, model_id="base", api_key=KEY), headers={"Authorization": f"Bearer {KEY}"})


def complete(http, model: str, prompt: str = "A prompt of a few more bytes", **kw):  # test 1's bucket: 32
    return http.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0,
                                              **kw})


def test_models_lists_the_adapters_and_a_request_s_model_picks_one(setup, http):
    data = http.get("/v1/models").json()["data"]
    assert [(m["id"], m.get("parent")) for m in data] == [("base", None), ("a", "base"), ("b", "base")]
    answers = {m: complete(http, m).json() for m in ("base", "a", "b")}
    assert [a["model"] for a in answers.values()] == ["base", "a", "b"]
    assert len({a["choices"][0]["text"] for a in answers.values()}) == 3  # three models, three answers
    chat = {"model": "b", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0}
    whole = http.post("/v1/chat/completions", json=chat).json()
    events = [json.loads(line[6:]) for line in http.post("/v1/chat/completions", json={**chat, "stream": True}).text
              .splitlines() if line.startswith("data: {")]
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == \
        whole["choices"][0]["message"]["content"] and {e["model"] for e in events} == {whole["model"]} == {"b"}
    r = complete(http, "c")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert "this server serves 'base', 'a', 'b'" in r.json()["error"]["message"]
    r = complete(http, "a", logprobs=1)  # scoring runs the base alone
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"


def test_an_adapter_loads_into_a_free_slot_without_compiling_and_unloads(setup, http):
    _, dirs, engine, _ = setup
    want = complete(http, "a").json()["choices"][0]["text"]
    compiled = engine._decode._cache_size(), engine._prefill._cache_size()
    load = {"lora_name": "a2", "lora_path": dirs["a"]}
    r = http.post("/v1/load_lora_adapter", json=load, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    r = http.post("/v1/load_lora_adapter", json=load)
    assert r.status_code == 200 and r.json()["slot"] == 3
    assert complete(http, "a2").json()["choices"][0]["text"] == want  # a's files under another name: a's answer
    assert (engine._decode._cache_size(), engine._prefill._cache_size()) == compiled
    r = http.post("/v1/load_lora_adapter", json={"lora_name": "a3", "lora_path": dirs["a"]})
    assert r.status_code == 400 and "all 3 adapter slots are taken" in r.json()["error"]["message"]
    assert http.post("/v1/unload_lora_adapter", json={"lora_name": "a2"}).status_code == 200
    assert complete(http, "a2").status_code == 404
    r = http.post("/v1/unload_lora_adapter", json={"lora_name": "a2"})
    assert r.status_code == 404 and "'a', 'b'" in r.json()["error"]["message"]
    assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["base", "a", "b"]


@pytest.mark.parametrize("name, words", [("wide", "has rank 8; this server's adapters hold rank 4 at most (restart "
                                                   "it with --max-lora-rank 8)"),
                                         ("other", "an adapter for another base?")])
def test_an_adapter_the_table_cannot_hold_is_refused_in_one_line(setup, http, name, words):
    _, dirs, _, _ = setup
    r = http.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": dirs[name]})
    message = r.json()["error"]["message"]
    assert r.status_code == 400 and words in message and "\n" not in message and dirs[name] not in message


def test_a_table_started_without_adapters_holds_the_layers_lora_targets_names(setup):
    lm, dirs, _, _ = setup
    table = AdapterTable.build(lm, {}, slots=1, rank=4, targets="q_proj,v_proj")
    assert sorted(table.shapes) == sorted(f"h_{i}/attn/{k}" for i in range(lm.config.model.num_layers)
                                          for k in ("query", "value"))
    assert table.put("a", read(lm, dirs["a"])) == 1 and float(abs(table.tables["h_0/attn/query"][0][1]).sum()) > 0
    with pytest.raises(ArgumentError, match="adapts h_0/mlp/.*restart the server with that layer among --lora-targets"):
        table.check("b", read(lm, dirs["b"]))  # b adapts down_proj too
    with pytest.raises(ArgumentError, match="--lora-targets names 'qproj', no layer of the base; choose from .*q_proj"):
        AdapterTable.build(lm, {}, rank=4, targets="qproj")
    with pytest.raises(ArgumentError, match="leave out --scan-layers"):  # the table names the looped layers
        Engine(lm, adapters=table, scan_layers=True)
    # unloading: refused while a sequence waits on it; then its slot zeroed and a free row's prefix under it forgotten
    waiting = queue.Queue()
    waiting.put(Sequence(prompt=[1], max_tokens=1, adapter=1))
    book = pages.Pages(2, 64, 9)
    for row, (tokens, slot) in enumerate((([5] * 40, 1), ([6] * 40, 0))):  # a prefix stored under each
        book.take(row, [], 40)
        book.grow(row, 40)
        book.store(row, tokens, slot)
        book.done(row)
    engine = types.SimpleNamespace(slots=2, rows=[None, None], waiting=waiting, deferred=[], book=book)
    with pytest.raises(InUse, match="adapter 'a' has 1 sequence"):
        table.remove("a", engine)
    waiting.get()
    assert book.lookup([5] * 40, 1) != [] and book.lookup([6] * 40, 0) != []
    assert table.remove("a", engine) == 1 and not table.names
    assert book.lookup([5] * 40, 1) == [] and len(book.lookup([6] * 40, 0)) == 2 and len(book.idle) == 2
    assert float(abs(table.tables["h_0/attn/query"][0][1]).sum()) == 0


def test_the_admin_routes_need_a_server_started_with_a_key(setup):
    from zoo.serve.app import create_app
    _, dirs, engine, _ = setup
    r = TestClient(create_app(engine, model_id="base")).post("/v1/load_lora_adapter",
                                                             json={"lora_name": "x", "lora_path": dirs["a"]})
    assert r.status_code == 403 and "--api-key" in r.json()["error"]["message"]


@pytest.mark.parametrize("argv, words", [(["--adapter", "a"], "--adapter 'a': give NAME=PATH"),
                                         (["--adapter", "a=x", "--adapter", "a=y"], "--adapter a=... is given twice"),
                                         (["--max-loras", "2"],
                                          "--max-loras goes with --adapter NAME=PATH or --lora-targets")])
def test_a_malformed_adapter_flag_is_one_error_line(argv, words, capsys):
    assert serve_cli.main(["llama_tiny", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1
