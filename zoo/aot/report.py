"""A compiled program -> the report's figures, read from XLA's own analyses and the optimized HLO:

- memory (`compiled.memory_analysis()`, per device): arguments, outputs, temporaries, generated code; with
  donation, outputs aliased to arguments are counted once;
- FLOPs and bytes accessed per device (`compiled.cost_analysis()`);
- collectives: the bytes each all-gather, reduce-scatter, all-reduce, all-to-all and collective-permute of the
  optimized HLO produces per device, summed by kind (a loop body's collectives counted once a trip where the
  loop counts from 0 to a constant, as jax's scans and microbatch loops do; once otherwise);
- kernels: the custom calls the program runs (a Pallas kernel shows as tpu_custom_call with its name).

The step time is a roofline **estimate**: max(FLOPs / peak, bytes accessed / HBM bandwidth) + collective bytes /
ICI bandwidth, per device, with no overlap of communication and compute assumed; MFU is the model's FLOPs (zoo's
own count) over that time at the chips' peak. A real step is slower where kernels fall short of peak, faster where
communication overlaps compute. XLA's cost analysis counts a loop's body once: the microbatch loop
(train.grad_accum) is multiplied back, and the FLOPs are at least zoo's own count (a scanned layer stack is such a
loop too), but the bytes accessed of a scanned stack are one layer's, so its HBM bound is low.
"""

from __future__ import annotations

import re

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s4": 0.5, "u4": 0.5, "bf16": 2, "f16": 2,
         "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16}
_SHAPE = re.compile(r"\b(" + "|".join(BYTES) + r")\[([\d,]*)\]")
_OP = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*?)\s+(" + "|".join(COLLECTIVES) + r")(-start)?\(")
_KERNEL = re.compile(r'custom_call_target="([^"]+)"')
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w\-]+?)(?:\.\d+)*\s*=")  # a Pallas call is named for its kernel


def _shape_bytes(text: str) -> int:
    total = 0
    for dtype, dims in _SHAPE.findall(text):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n * BYTES[dtype]
    return int(total)


def bytes_per_device(tree) -> int:
    """Bytes one device holds of a tree of (sharded) abstract arrays: each leaf's shard, or the whole leaf."""
    import jax
    import numpy as np
    total = 0
    for a in jax.tree.leaves(tree):
        shape = a.sharding.shard_shape(a.shape) if getattr(a, "sharding", None) is not None else a.shape
        total += int(np.prod(shape)) * np.dtype(a.dtype).itemsize
    return total


def collectives(hlo: str) -> dict[str, int]:
    """kind -> bytes produced per device by that kind of collective in the optimized HLO text, a loop body's
    (a scanned layer stack, the microbatch loop) times the trips its loop makes."""
    out = {k: 0 for k in COLLECTIVES}
    comps, entry = _computations(hlo)
    runs = _runs(comps, entry)
    for name, lines in comps.items():
        for line in lines:
            m = _OP.match(line)
            if m:
                result = m.group(1)
                if m.group(3):  # an async start's result is (operands, outputs[, scratch]): count the outputs
                    parts = _top_level(result)
                    result = parts[1] if len(parts) > 1 else result
                out[m.group(2)] += _shape_bytes(result) * runs.get(name, 1)
    return out


_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_WHILE = re.compile(r"\bcondition=%([\w.\-]+), body=%([\w.\-]+)")
_CALLED = re.compile(r"\b(?:calls|to_apply|branch_computations)=\{?((?:%[\w.\-]+(?:,\s*)?)+)")
_S32 = re.compile(r"^\s*%([\w.\-]+) = s32\[\](?:\{[^}]*\})? constant\((\d+)\)")
_BOUND = re.compile(r"^\s*ROOT .*compare\(%[\w.\-]+, %([\w.\-]+)\), direction=LT")


def _computations(hlo: str) -> tuple[dict[str, list[str]], str | None]:
    """(name -> its instruction lines, the entry computation's name)."""
    comps, name, entry = {}, None, None
    for line in hlo.splitlines():
        m = _COMPUTATION.match(line)
        if m and not line.startswith(" "):
            name = m.group(2)
            comps[name] = []
            entry = name if m.group(1) else entry
        elif line.startswith("}"):
            name = None
        elif name is not None:
            comps[name].append(line)
    return comps, entry


def _trips(condition: list[str]) -> int:
    """A counted loop's trips, as jax writes one (a counter from 0 compared `< N`); 1 where that is not it."""
    consts = dict(m.groups() for m in map(_S32.match, condition) if m)
    for line in condition:
        m = _BOUND.match(line)
        if m and m.group(1) in consts:
            return int(consts[m.group(1)])
    return 1


def _runs(comps: dict, entry: str | None) -> dict[str, int]:
    """name -> how often one step runs the computation: a while body times its trips, through nested loops."""
    runs = {}

    def visit(name: str, times: int) -> None:
        runs[name] = runs.get(name, 0) + times
        for line in comps.get(name, ()):
            w = _WHILE.search(line)
            if w:
                visit(w.group(2), times * _trips(comps.get(w.group(1), [])))
            for called in _CALLED.findall(line):
                for callee in re.findall(r"%([\w.\-]+)", called):
                    visit(callee, times)
    if entry is not None:
        visit(entry, 1)
    return runs


def _top_level(tuple_text: str) -> list[str]:
    """'((a, b), c, d)' -> ['(a, b)', 'c', 'd']: the elements of an HLO tuple type."""
    t = tuple_text.strip()
    if not t.startswith("("):
        return [t]
    parts, depth, cur = [], 0, ""
    for ch in t[1:-1]:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts]


def kernels(hlo: str) -> list[str]:
    """The custom calls of the program, sorted; a Pallas kernel as tpu_custom_call:NAME where its name shows."""
    names = set()
    for line in hlo.splitlines():
        for target in _KERNEL.findall(line):
            if target == "tpu_custom_call":
                m = _INSTRUCTION.match(line)
                names.add(f"tpu_custom_call:{m.group(1)}" if m else target)
            else:
                names.add(target)
    return sorted(names)


def memory(compiled) -> dict[str, int]:
    m = compiled.memory_analysis()
    args, out, alias = m.argument_size_in_bytes, m.output_size_in_bytes, m.alias_size_in_bytes
    temp, code = m.temp_size_in_bytes, m.generated_code_size_in_bytes
    return {"arguments": int(args), "outputs": int(out), "aliased": int(alias), "temporaries": int(temp),
            "code": int(code), "total": int(args + out - alias + temp + code)}


def cost(compiled) -> dict[str, float]:
    ca = compiled.cost_analysis()
    ca = (ca[0] if ca else {}) if isinstance(ca, (list, tuple)) else (ca or {})
    return {"flops": float(ca.get("flops", 0.0)), "bytes_accessed": float(ca.get("bytes accessed", 0.0))}


_OOM = re.compile(r"memory required for HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds available HBM \(([\d.]+)([KMGT]?)\)")
_UNIT = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}


def compiled(compile_fn, fixed: dict) -> dict:
    """The figures of the program `compile_fn()` compiles (see the module's docstring), `fixed` (params and
    optimizer bytes per device, from the abstract state) added to its memory. A program whose temporaries
    exceed the chip's HBM is refused by XLA's TPU compiler: its figures are then what the refusal says (the
    temporaries), with no FLOPs, collectives or kernels."""
    from jax.errors import JaxRuntimeError
    try:
        c = compile_fn()
    except JaxRuntimeError as e:
        m = _OOM.search(str(e))
        if not m:
            raise
        temp = float(m.group(1)) * _UNIT[m.group(2)]
        mem = {"arguments": fixed["params"] + fixed["optimizer"], "outputs": 0, "aliased": 0, "temporaries": int(temp),
               "code": 0, "total": int(fixed["params"] + fixed["optimizer"] + temp), **fixed}
        return {"bytes_per_device": mem, "flops_per_device": None, "bytes_accessed_per_device": None,
                "collective_bytes": {k: 0 for k in COLLECTIVES}, "kernels": [],
                "refused": f"XLA: HLO temporaries {m.group(1)}{m.group(2)} exceed the available HBM {m.group(3)}{m.group(4)}"}
    hlo, ca = c.as_text(), cost(c)
    return {"bytes_per_device": {**memory(c), **fixed}, "flops_per_device": ca["flops"],
            "bytes_accessed_per_device": ca["bytes_accessed"], "collective_bytes": collectives(hlo),
            "kernels": kernels(hlo)}


def roofline(flops: float, bytes_accessed: float, comm_bytes: float, chip) -> dict[str, float]:
    """Seconds per step on one device of `chip`, each bound and their estimate (see the module's docstring)."""
    compute, hbm, comm = flops / chip.bf16_flops, bytes_accessed / chip.hbm_bytes_per_s, comm_bytes / chip.ici_bytes_per_s
    return {"compute_s": compute, "hbm_s": hbm, "collective_s": comm, "step_s": max(compute, hbm) + comm}


def header(t, devices: int, mesh) -> dict:
    """The fields every report opens with: the target (`zoo.aot.target.parse`'s), its chips and devices, the chip's
    figures, the HBM one device holds and the mesh's axes."""
    import dataclasses
    chip = t.chip
    return {"target": t.name, "topology": t.topology, "slices": t.slices, "chips": t.chips, "devices": devices,
            "chip": dataclasses.asdict(chip), "hbm_per_device": chip.hbm_bytes * t.chips / devices,
            "mesh": dict(mesh.shape)}


def gib(n: float) -> str:
    return f"{n / 1024 ** 3:.2f} GiB" if n >= 1024 ** 3 / 10 else f"{n / 1024 ** 2:.1f} MiB"


def text(r: dict) -> str:
    """The report as lines for a terminal."""
    mem, chip = r["bytes_per_device"], r["chip"]
    kv = f", KV cache {gib(mem['kv_cache'])}" if "kv_cache" in mem else ""
    lines = [f"target          {r['target']} ({r['devices']} devices of {chip['device_kind']}, {r['chips']} chips"
             f"{', ' + str(r['slices']) + ' slices' if r['slices'] > 1 else ''}); mesh "
             + " ".join(f"{k}={v}" for k, v in r["mesh"].items()),
             f"program         {r['program']}; compiled in {r['compile_seconds']:.1f} s",
             f"per device      params {gib(mem['params'])}, optimizer state {gib(mem['optimizer'])}{kv}, "
             f"temporaries {gib(mem['temporaries'])}, total {gib(mem['total'])} of {gib(r['hbm_per_device'])} HBM"
             f" ({chip['source']})",
             f"fits            {'yes' if r['fits'] else 'NO'}"]
    if r.get("refused"):
        return "\n".join(lines + [f"compiler        {r['refused']}: the step does not fit, nothing more to report"])
    if r.get("largest_batch") is not None:
        lines.append(f"largest batch   {r['largest_batch']} (train.batch_size that fits, found by compiling)")
    trips = r.get("loop_trips", 1)
    lines += [f"FLOPs/step      {r['flops_per_device']:.4g} per device from XLA"
              + (f" x {trips} microbatches (XLA counts the loop's body once)" if trips > 1 else "")
              + f" x {r['devices']} = {r['flops_per_device'] * trips * r['devices']:.4g}; zoo's model count "
              f"{r['model_flops']:.4g}"
              + (" (XLA counts the decode loop's body once)" if "kv_cache" in mem else ""),
              "collectives     " + (", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in r["collective_bytes"].items() if v)
                                    or "none") + " per device",
              "kernels         " + (", ".join(r["kernels"]) or "none"),
              _estimate(r["estimate"])]
    if "engine" in r:
        lines.append(f"paged attention {r['engine']['paged_attention']}")
    if "prefill" in r:  # zoo-serve's engine: its second program
        p = r["prefill"]
        lines.append(f"prefill         {p['refused'] or 'total ' + gib(p['bytes_per_device']['total']) + ' per device'}"
                     f"; compiled in {p['compile_seconds']:.1f} s; kernels " + (", ".join(p["kernels"]) or "none"))
    return "\n".join(lines)


def _estimate(e: dict) -> str:
    if "per_token_s" in e:  # generation
        return (f"estimate        prefill {e['prefill_s'] * 1e3:.2f} ms, {e['per_token_s'] * 1e3:.2f} ms a new token "
                f"(params + KV cache read once), {e['tokens_per_s']:,.0f} tokens/s -- a roofline estimate")
    return (f"estimate        step {e['step_s'] * 1e3:.1f} ms (compute {e['compute_s'] * 1e3:.1f}, HBM "
            f"{e['hbm_s'] * 1e3:.1f}, collectives {e['collective_s'] * 1e3:.1f} ms), MFU {e['mfu'] * 100:.1f}% -- a "
            f"roofline estimate, not a measurement")
