#!/usr/bin/env python3
"""Prints the host's module import graph and fails if it has a cycle or an import that climbs.

Each file of host/src is a node (`foo/mod.rs` is `foo`); an edge is a `crate::a::b` or `super::x`
path that leads into another module. A module and its own submodules are one unit (a backend and
its private parts), so edges between them are not counted; `mod` declarations are not edges.
Paths resolve to the longest module that exists. CI runs this: the layers must point one way
(docs/architecture.md, whose layer table is LAYERS below): a module may import modules of its own
layer or lower ones, never higher ones, and every module must have a layer.

`--self-test` checks the checker on a made-up graph (CI runs it too).
"""
import os, re, sys

# The layers of docs/architecture.md, by module path prefix (the longest prefix decides).
LAYERS = {
    ("metrics",): 1, ("limits",): 1, ("scheduler", "rate_limit"): 1, ("device",): 1,
    ("store",): 1, ("telemetry",): 1, ("sequence",): 1,
    ("backend",): 2,
    ("scheduler",): 3, ("model",): 3, ("warmup",): 3,
    ("tenants",): 3.5, ("shm",): 3.5,
    ("repository",): 4, ("functions",): 4, ("deploy",): 4,
    ("server",): 5, ("api",): 5,
    ("protocol",): 6, ("cli",): 6, ("guest_build",): 6, (): 6,
}


def layer_of(module, layers=LAYERS):
    for n in range(len(module), -1, -1):
        if tuple(module[:n]) in layers:
            return layers[tuple(module[:n])]
    return None


# What the front-ends may import of the host: the API boundary, and the settings they apply.
FRONT_END = ("protocol",)
FRONT_END_MAY_USE = {("api",), ("limits",), ("telemetry",)}


def reaches_in(edges):
    """Imports from a front-end past the API boundary."""
    return sorted((a, b) for a, targets in edges.items() for b in targets
                  if a[:1] == FRONT_END and b[:1] != FRONT_END and b not in FRONT_END_MAY_USE)


def climbs(edges, layers=LAYERS):
    """The imports that go up a layer, and the modules without a layer."""
    unplaced = sorted(m for m in edges if layer_of(m, layers) is None)
    up = sorted((a, b) for a, targets in edges.items() for b in targets
                if None not in (layer_of(a, layers), layer_of(b, layers))
                and layer_of(b, layers) > layer_of(a, layers))
    return up, unplaced


if "--self-test" in sys.argv:
    toy = {("low",): {("high",)}, ("high",): {("low",)}, ("lost",): set()}
    up, unplaced = climbs(toy, {("low",): 1, ("high",): 2})
    assert up == [(("low",), ("high",))], up
    assert unplaced == [("lost",)], unplaced
    assert reaches_in({("protocol", "x"): {("api",), ("store",), ("protocol",)}}) == [
        (("protocol", "x"), ("store",))]
    print("self-test: a climbing import, a module without a layer and a front-end reaching past "
          "the API are caught")
    sys.exit(0)

ROOT = os.path.join(os.path.dirname(__file__), "..", "host", "src")
modules = {}
for dirpath, _, files in os.walk(ROOT):
    for f in files:
        if not f.endswith(".rs"):
            continue
        rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].split(os.sep)
        if rel[-1] in ("mod", "lib", "main"):
            rel = rel[:-1]
        modules[tuple(rel)] = os.path.join(dirpath, f)

def resolve(path):
    for n in range(len(path), 0, -1):
        if tuple(path[:n]) in modules:
            return tuple(path[:n])
    return None

edges = {m: set() for m in modules}
for mod, file in modules.items():
    text = open(file).read()
    text = re.sub(r"#\[cfg\(test\)\]\s*mod tests \{.*", "", text, flags=re.S)
    for m in re.finditer(r"\bcrate::((?:\w+::)*\w+)", text):
        target = resolve(m.group(1).split("::"))
        if target and target != mod and target != mod[: len(target)]:
            edges[mod].add(target)
    for m in re.finditer(r"\bsuper::((?:\w+::)*\w+)", text):
        parent = list(mod[:-1])
        target = resolve(parent + m.group(1).split("::")) or tuple(parent)
        if target and target != mod and target != mod[: len(target)]:
            edges[mod].add(target)

# Tarjan's strongly connected components.
index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]
def visit(v):
    index[v] = low[v] = counter[0]; counter[0] += 1
    stack.append(v); on.add(v)
    for w in edges[v]:
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        scc = []
        while True:
            w = stack.pop(); on.discard(w); scc.append(w)
            if w == v:
                break
        sccs.append(scc)
sys.setrecursionlimit(10000)
for v in modules:
    if v not in index:
        visit(v)
name = lambda m: "::".join(m) or "crate"
for m in sorted(modules):
    print(f"{name(m):28} -> {', '.join(sorted(name(t) for t in edges[m]))}")
cycles = [s for s in sccs if len(s) > 1]
for c in cycles:
    print("CYCLE:", " <-> ".join(sorted(name(m) for m in c)))
up, unplaced = climbs(edges)
for a, b in up:
    print(f"CLIMBS: {name(a)} (layer {layer_of(a)}) imports {name(b)} (layer {layer_of(b)})")
for m in unplaced:
    print(f"NO LAYER: {name(m)}: give it one in scripts/import-graph.py and docs/architecture.md")
inside = reaches_in(edges)
for a, b in inside:
    print(f"PAST THE API: {name(a)} imports {name(b)}: front-ends use crate::api")
if cycles or up or unplaced or inside:
    sys.exit(1)
print("no cycle, no import climbs a layer, front-ends use only the API")
