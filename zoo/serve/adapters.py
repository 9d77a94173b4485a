"""zoo-serve's adapters per request (zoo-serve BASE --adapter NAME=PATH; the table itself: zoo.engine.adapters): a
request's `model` names the base or an adapter, GET /v1/models lists them, and two admin routes in vLLM's shape load
and unload adapters while the server runs:

    GET  /v1/models                  the base, then each adapter with "parent": the base's id (as vLLM lists them)
    POST /v1/load_lora_adapter       {"lora_name", "lora_path"}: the PEFT adapter directory at lora_path (a path on
                                     the server's machine) read, checked against the base and written into a free
                                     slot of the table (nothing compiles)
    POST /v1/unload_lora_adapter     {"lora_name"}: its slot freed; refused (409) while sequences run it

The admin routes read paths on the server's disk, so they answer only a server started with --api-key (and, as every
route but /health, only a request that sends it): on a server without one they are refused with a 403 naming the
setting. An unknown name is a 404 listing the names served; an adapter the table cannot hold (another base's shapes,
a rank above --max-lora-rank, no free slot) a 400 in one line. Scoring (logprobs) and /v1/embeddings run the base
alone: a request naming an adapter there is a 400.
"""

from __future__ import annotations

import asyncio
import json
import time

from fastapi import Request

from zoo.errors import ZooError
from zoo.serve.request_checks import ApiError, without_paths


def served(engine, model_id: str) -> list[str]:
    """The names a request's `model` may give: the base's, then the adapters'."""
    table = getattr(engine, "adapters", None)
    return [model_id, *(table.names if table is not None else ())]


def slot_of(engine, model, model_id: str) -> int:
    """The adapter slot a request's `model` names (0: the base, or no model given); else a 404 listing the names."""
    if model is None or model == model_id:
        return 0
    table = getattr(engine, "adapters", None)
    if table is not None and isinstance(model, str) and model in table.names:
        return table.names[model]
    names = ", ".join(f"'{n}'" for n in served(engine, model_id))
    raise ApiError(404, f"the model {json.dumps(model)[:80]} does not exist; this server serves {names}",
                   param="model", code="model_not_found")


def base_only(request: Request, what: str) -> None:
    """A 400 where a request naming an adapter asks for what runs on the base alone (`what`)."""
    if getattr(request.state, "adapter", 0):
        raise ApiError(400, f"{what} runs the base model alone on this server; send the base's name as 'model'",
                       param="model")


def _name(body: dict, field: str) -> str:
    v = body.get(field)
    if not isinstance(v, str) or not v or len(v) > 256:
        raise ApiError(400, f"'{field}' must be a non-empty string; got {json.dumps(v)[:80]}", param=field)
    return v


def install(app, engine, *, model_id: str, api_key: str | None, body_of) -> None:
    """GET /v1/models and, for a decoder's engine, the admin routes (see the module's docstring)."""

    @app.get("/v1/models")
    async def models():
        created = int(time.time())
        data = [{"id": model_id, "object": "model", "created": created, "owned_by": "zoo"}]
        table = getattr(engine, "adapters", None)
        for name in (table.names if table is not None else ()):
            data.append({"id": name, "object": "model", "created": created, "owned_by": "zoo", "parent": model_id})
        return {"object": "list", "data": data}

    if engine is None:
        return

    def admin() -> None:
        if api_key is None:
            raise ApiError(403, "loading and unloading adapters reads paths on the server's machine: it needs a server "
                                "started with --api-key", "permission_error")
        if engine.adapters is None:
            raise ApiError(400, "this server was started without adapters; its adapter table (layers, rank, slots) is "
                                "fixed at start: restart it with --adapter NAME=PATH or --lora-targets")

    async def on_engine(fn):
        from zoo.engine.adapters import InUse
        try:
            return await asyncio.wrap_future(engine.job(fn))
        except ZooError as e:  # the table's refusal (in use: 409, a conflict that passes)
            raise ApiError(409 if isinstance(e, InUse) else 400, without_paths(str(e)), param="lora_name") from None
        except KeyError as e:  # unloaded meanwhile by another request
            raise ApiError(404, f"no adapter named {e} is loaded", param="lora_name") from None
        except RuntimeError as e:  # the server stopping
            raise ApiError(503, str(e), "server_error") from None

    @app.post("/v1/load_lora_adapter")
    async def load(request: Request):
        admin()
        body = await body_of(request, {})
        name, path = _name(body, "lora_name"), _name(body, "lora_path")
        if name in served(engine, model_id):
            raise ApiError(400, f"the name {name!r} is served already; unload it first (or choose another)",
                           param="lora_name")
        from zoo.engine.adapters import read
        try:
            adapter = await asyncio.to_thread(read, engine.lm, path)
            engine.adapters.check(name, adapter)
        except (ZooError, OSError) as e:
            raise ApiError(400, without_paths(str(e)), param="lora_path") from None
        slot = await on_engine(lambda: engine.adapters.put(name, adapter, engine))
        return {"object": "lora_adapter", "id": name, "parent": model_id, "slot": slot, "rank": adapter.rank}

    @app.post("/v1/unload_lora_adapter")
    async def unload(request: Request):
        admin()
        body = await body_of(request, {})
        name = _name(body, "lora_name")
        if name not in engine.adapters.names:
            names = ", ".join(f"'{n}'" for n in engine.adapters.names) or "none"
            raise ApiError(404, f"no adapter named {json.dumps(name)[:80]} is loaded; the adapters: {names}",
                           param="lora_name", code="model_not_found")
        slot = await on_engine(lambda: engine.adapters.remove(name, engine))
        return {"object": "lora_adapter", "id": name, "slot": slot, "deleted": True}
