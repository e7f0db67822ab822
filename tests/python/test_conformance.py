"""Conformance: kvtier's connectors and the engine stand-ins bound against
the upstream interface manifests (tests/python/conformance/*.json: for
every method the engine calls, its parameters and return annotation at each
pinned generation, with the file and commit they were read at).

One test per (engine, generation, method), so an interface change upstream
— a parameter added, renamed, dropped, or a return type changed — recorded
in the manifest shows up as one failing line naming the method, the
generation and the upstream commit:

  test_connector_binds[vllm-current-handle_preemptions]

- test_connector_binds: kvtier's connector can be called the way the
  engine calls the method at that generation (positionally and/or by
  keyword, extra keyword arguments where upstream passes **kwargs), and its
  return annotation is upstream's (or a declared alias: a subclass); a
  "property" entry (read as an attribute upstream) must be a property of
  upstream's type. A method the connector does not define is answered by
  the engine's base class (the stand-in must have it). A method of a
  mixin (vLLM's SupportsHMA) names it as its "base".
- test_declined: an interface the manifest lists as declined (with the
  reason) is not defined by the connector.
- test_standin_matches: the stand-in's base class (tests/python/shims) has
  exactly upstream's parameters (names, order, defaults; annotations where
  it gives one other than Any) and return annotation for the
  generation the stand-ins run as ($KVT_VLLM_GEN, $KVT_SGLANG_GEN) — the
  stand-ins cannot drift from the manifest.
"""
from __future__ import annotations

import importlib
import inspect
import json
import os
import re
from typing import Any, Dict, Tuple

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SELECTED = {"vllm": os.environ.get("KVT_VLLM_GEN", "current"),
            "sglang": os.environ.get("KVT_SGLANG_GEN", "current")}


def manifest(engine: str) -> Dict[str, Any]:
    with open(os.path.join(HERE, "conformance", engine + ".json"),
              encoding="utf-8") as f:
        return json.load(f)


MANIFESTS = {e: manifest(e) for e in ("vllm", "sglang")}
CASES = [(e, g, name) for e, m in MANIFESTS.items()
         for g, gen in m["generations"].items() for name in gen["methods"]]


def _unwrap(t: str, name: str) -> str:
    """Optional[X] -> X | None, by bracket matching."""
    while True:
        i = t.find(name + "[")
        if i < 0:
            return t
        j, depth = i + len(name) + 1, 1
        while depth:
            depth += {"[": 1, "]": -1}.get(t[j], 0)
            j += 1
        inner = t[i + len(name) + 1:j - 1]
        t = t[:i] + f"{inner} | None" + t[j:]


def norm(ann: Any) -> str:
    """A type annotation as comparable text: typing's capitalised
    generics as builtins, Optional[X] as X | None, no quotes or spaces,
    the parts of a union sorted."""
    if ann is inspect.Parameter.empty or ann is None:
        return ""
    t = ann if isinstance(ann, str) else getattr(ann, "__name__", str(ann))
    t = t.replace('"', "").replace("'", "").replace("typing.", "")
    t = _unwrap(t, "Optional")
    for a, b in (("List", "list"), ("Dict", "dict"), ("Set", "set"),
                 ("Tuple", "tuple"), ("FrozenSet", "frozenset")):
        t = re.sub(rf"\b{a}\b", b, t)
    t = t.replace(" ", "")
    # top-level union parts in a stable order
    parts, depth, cur = [], 0, ""
    for ch in t:
        if ch == "|" and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += {"[": 1, "]": -1}.get(ch, 0)
        cur += ch
    parts.append(cur)
    return "|".join(sorted(parts))


def parse(p: str) -> Tuple[str, str, bool]:
    """'name: ann = default' -> (name, ann, has default)."""
    has_default = "=" in p
    head = p.split("=")[0].strip()
    name, _, ann = head.partition(":")
    return name.strip(), ann.strip(), has_default


def resolve(spec: str) -> Any:
    mod, _, attr = spec.partition(":")
    return getattr(importlib.import_module(mod), attr)


def base_of(m: Dict[str, Any], spec: Dict[str, Any]) -> Any:
    """The engine class that declares the method: the manifest's base,
    or the method's own "base" (a mixin such as vLLM's SupportsHMA) when
    this generation's stand-ins have it."""
    try:
        return resolve(spec.get("base", m["base"]))
    except AttributeError:
        return resolve(m["base"])


def where(engine: str, gen: str) -> str:
    g = MANIFESTS[engine]["generations"][gen]
    return f"{g['file']}@{g['commit'][:12]} ({g['release']})"


def own(cls: type, name: str, base: type) -> bool:
    """Whether @cls defines @name itself (not only its base class)."""
    for k in cls.__mro__:
        if k is base:
            return False
        if name in k.__dict__:
            return True
    return False


@pytest.mark.parametrize("engine,gen,name", CASES,
                         ids=[f"{e}-{g}-{n}" for e, g, n in CASES])
def test_connector_binds(engine: str, gen: str, name: str) -> None:
    m = MANIFESTS[engine]
    spec = m["generations"][gen]["methods"][name]
    cls, base = resolve(m["connector"]), base_of(m, spec)
    if not own(cls, name, base):
        if gen == SELECTED[engine]:
            assert hasattr(base, name), \
                f"{name}: neither the connector nor the stand-in defines it"
        return      # the engine's own base class answers it
    if spec["kind"] == "property":      # read as an attribute upstream
        prop = inspect.getattr_static(cls, name)
        assert isinstance(prop, property), (
            f"{m['connector']}.{name} is not a property, as {engine} {gen} "
            f"reads it [{where(engine, gen)}]")
        got = norm(prop.fget.__annotations__.get("return", ""))
        assert got == norm(spec["returns"]), (
            f"{m['connector']}.{name} is {got!r}; {engine} {gen} expects "
            f"{spec['returns']!r} [{where(engine, gen)}]")
        return
    fn = getattr(cls, name)
    sig = inspect.signature(fn)
    params = [parse(p) for p in spec["params"]]
    pos = [n for n, _, _ in params if not n.startswith("*")]
    star_kw = any(n.startswith("**") for n, _, _ in params)
    lead = [] if spec["kind"] == "classmethod" else [None]
    call = spec["call"]
    what = (f"{m['connector']}.{name}{sig} is not callable as "
            f"{engine} {gen} calls it: ({', '.join(spec['params'])}) "
            f"-> {spec['returns']} [{where(engine, gen)}]")
    try:
        if call in ("positional", "both"):
            sig.bind(*lead, *[object() for _ in pos],
                     **({"_extra_kw": 1} if star_kw else {}))
        if call in ("keyword", "both"):
            sig.bind(*lead, **{n: object() for n in pos},
                     **({"_extra_kw": 1} if star_kw else {}))
    except TypeError as e:
        pytest.fail(f"{what}: {e}")
    if name != "__init__":
        got = norm(fn.__annotations__.get("return", ""))
        want = norm(spec["returns"])
        ok = {want} | {norm(a) for a in m["aliases"].get(spec["returns"],
                                                         ())}
        assert got in ok, (f"{m['connector']}.{name} returns {got!r}; "
                           f"{engine} {gen} expects {spec['returns']!r} "
                           f"[{where(engine, gen)}]")


SELECTED_CASES = [c for c in CASES if c[1] == SELECTED[c[0]]]


@pytest.mark.parametrize("engine,gen,name", SELECTED_CASES,
                         ids=[f"{e}-{g}-{n}" for e, g, n in SELECTED_CASES])
def test_standin_matches(engine: str, gen: str, name: str) -> None:
    m = MANIFESTS[engine]
    spec = m["generations"][gen]["methods"][name]
    base = base_of(m, spec)
    assert hasattr(base, name), \
        f"stand-in {spec.get('base', m['base'])} has no {name}"
    if spec["kind"] == "property":
        assert isinstance(inspect.getattr_static(base, name), property), \
            f"stand-in {name} is not a property [{where(engine, gen)}]"
        return
    fn = getattr(base, name)
    got = list(inspect.signature(fn).parameters.values())
    if spec["kind"] != "classmethod":
        got = got[1:]               # self
    want = [parse(p) for p in spec["params"]]
    if name == "__init__" and engine == "sglang":
        return      # HiCacheStorage defines no constructor: the factory's
        # call (cls(storage_config, kwargs)) is checked on the connector
    gp = [(("**" if p.kind is p.VAR_KEYWORD else
            "*" if p.kind is p.VAR_POSITIONAL else "") + p.name,
           norm(p.annotation), p.default is not p.empty) for p in got]
    wp = [(n, norm(a), d) for n, a, d in want]
    assert [(n, d) for n, _, d in gp] == [(n, d) for n, _, d in wp], \
        (f"stand-in {name}: parameters {gp} differ from upstream {wp} "
         f"[{where(engine, gen)}]")
    # the stand-ins do not model every type: Any stands for one, any other
    # annotation must be upstream's
    for (n, ga, _), (_, wa, _) in zip(gp, wp):
        assert ga in ("", "Any") or ga == wa, (
            f"stand-in {name}({n}): {ga!r} vs upstream {wa!r} "
            f"[{where(engine, gen)}]")
    gr = norm(getattr(fn, "__annotations__", {}).get("return", ""))
    wr = norm(spec["returns"])
    assert name == "__init__" or gr in ("", "Any") or gr == wr, (
        f"stand-in {name} returns {gr!r}, upstream {wr!r} "
        f"[{where(engine, gen)}]")


DECLINED = [(e, n) for e, m in MANIFESTS.items()
            for n in m.get("declined", {})]


@pytest.mark.parametrize("engine,name", DECLINED,
                         ids=[f"{e}-declined-{n}" for e, n in DECLINED])
def test_declined(engine: str, name: str) -> None:
    """An upstream interface the connector declines (the manifest says
    why) is not half-implemented: the connector has no such method, so
    the engine never takes it for one that supports it."""
    m = MANIFESTS[engine]
    spec = m["declined"][name]
    assert spec.get("reason"), f"{name}: declined without a reason"
    assert not hasattr(resolve(m["connector"]), name), (
        f"{m['connector']} defines {name}, declined in the manifest "
        f"({spec['reason'][:60]}...): move it to the generations' methods")

