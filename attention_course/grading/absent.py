"""The package as a submission's sandbox sees it: only what the exercise hands out is real.

The grader does not watch, inside the student's kernel, whether the reference is called:
the student controls that process (a profiler switched off, a thread, a pool, an import
hook). Instead the reference is *absent* there. :func:`build` makes, on the grader's
side, a copy of the ``attention_course`` package in which

* what the exercise hands out is real: the names its given cells import
  (``allowed`` in ``exercise_given.json``, written by ``attention-course release``; e.g.
  ``attention_course.get_device``, exercise 10's ``MultiHeadAttention``), less the
  checkers (``attention_course.checks.check_*`` and ``quiz.check_quiz``: the grader skips
  the check cells and runs the checks itself, on its own side);
* so is everything those need to work, found statically from the source: the top-level
  functions, classes and module-level values their bodies, decorators, defaults and
  bases use, through ``from .x import y`` (also inside functions) and ``module.name``;
* so is the kernel side of the grader (:func:`attention_course.grading.sandbox.serve`,
  the ``attention_course.grading._kernel`` launcher, and what they use), and what any
  module-level statement of the package calls while it is imported (so every module
  imports);
* every other top-level function and class of the package (the graded targets, what
  they could be assembled from: ``sliding_window_mask(T, T)`` is a causal mask; the
  checkers, which hold and call the reference) is a stub that imports but raises
  :class:`NotAvailableWhileGrading` when called, instantiated, subclassed or read
  (``attention_course.causal_mask is not available while grading: write it yourself
  (the exercise gives: ...)``);
* files that are not Python (assets, data, the released JSON records) are copied as
  they are.

Calling the reference then reaches nothing, whatever the spelling (``ac.x``,
``importlib``, ``getattr``, ``sys.modules``), the thread or process (a pool), the
import hook or the copy of the files: the sandbox (`attention_course.grading.isolation`)
binds the build at ``/opt/attention-course/attention_course`` and shows no other copy
of the package. Absence holds **only in the sandbox**: ``attention-course grade
--no-sandbox`` runs the kernel on the real package, unconfined.

A target that is itself in the closure of a name the exercise hands out cannot be
absent without breaking what the exercise gives (exercise 14 hands out ``apply_rope``,
its task 1's target, as ``package_rope`` for its task 4). :func:`real_targets` lists
them; for those the build is no defence and the grader's identity check of the
candidate (the reference itself is reported as such) and the static scan
(`attention_course.grading.cheats.scan_notebook`) remain.

What an exercise hands out can instead be *served* (:data:`SERVED`): exercise 13 gives
``step_decoder()``, a GPT whose blocks are its task 2's ``CausalSelfAttention``. Kept real,
it would put a working causal self-attention in the sandbox (a subclass of
``type(step_decoder().gpt.blocks[0].attn))`` passed task 2). So the grader keeps that model
in its own process and hands the kernel a stand-in whose few offered calls run there
(`attention_course.grading.sandbox`, ``served_while_grading``); in the build,
``step_decoder`` is a stub that says so, and the GPT, which nothing real needs any more,
is a stub like every other reference. The exercise's given cell that demonstrates the
model becomes a note.

Builds are cached per (exercise, content hash of the package) in a temporary folder
for one grading run (:class:`Builds`).
"""

from __future__ import annotations

import ast
import hashlib
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "attention_course"
RUNTIME_MODULE = "_not_available"  # the stubs' helper, written into every build
# What the grader's probe and the kernel launcher run inside the sandbox
KERNEL_ROOTS = (
    (f"{PACKAGE}.grading.sandbox", "serve"),
    (f"{PACKAGE}.grading._kernel", "main"),
    (f"{PACKAGE}.grading.isolation", "set_limits"),
)
# What an exercise hands out that the grader serves instead: the object it makes stays in
# the grader, and the kernel gets a stand-in whose calls run there on plain data
# (`attention_course.grading.sandbox`, ``served_while_grading``). In the build it is a stub
# that says so. Exercise 13's model (a GPT made of causal self-attention, its task 2): had
# it been real in the sandbox, a subclass of its attention class would pass task 2.
SERVED = {
    f"{PACKAGE}.checks.generation.step_decoder": (
        "the grader makes this model and runs it on its own side; the task it is given "
        "for (generate) gets it as its argument"
    ),
}
_RUNTIME = r'''"""Stubs of the references that are absent while grading (written by the grader)."""


class NotAvailableWhileGrading(Exception):
    """A reference that the exercise does not hand out was called while grading."""


def _message(name, gives):
    text = f"{name} is not available while grading: write it yourself"
    return text + (f" (the exercise gives: {gives})" if gives else "")


def _refusing(module, qualname, message):
    # The message is a constant of the stub's own code, and the error class a global of
    # this module: a copy of the function (its code with other globals) still refuses.
    source = f"def {qualname}(*args, **kwargs):\n    raise NotAvailableWhileGrading({message!r})\n"
    made = {}
    exec(compile(source, __file__, "exec"), globals(), made)
    absent = made[qualname]
    absent.__module__ = module
    absent.__doc__ = message
    return absent


def function(module, qualname, name, gives):
    return _refusing(module, qualname, _message(name, gives))


class _Absent(type):
    """The metaclass of an absent class: no instance, no subclass, no attribute."""

    def __new__(mcls, name, bases, namespace, **kwargs):
        for base in bases:
            if isinstance(base, _Absent):
                raise NotAvailableWhileGrading(type.__getattribute__(base, "_absent_message"))
        return super().__new__(mcls, name, bases, namespace, **kwargs)

    def __call__(cls, *args, **kwargs):
        raise NotAvailableWhileGrading(type.__getattribute__(cls, "_absent_message"))

    def __getattr__(cls, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        raise NotAvailableWhileGrading(type.__getattribute__(cls, "_absent_message"))

    def __mro_entries__(cls, bases):  # pragma: no cover - only for non-class bases
        raise NotAvailableWhileGrading(type.__getattribute__(cls, "_absent_message"))


def served(module, qualname, name, why):
    # handed out, but the grader makes and runs what it makes: the kernel gets a stand-in
    return _refusing(module, qualname, f"{name} is not available while grading: {why}")


def cls(module, qualname, name, gives):
    message = _message(name, gives)
    namespace = {"__module__": module, "__qualname__": qualname, "__doc__": message}
    namespace["_absent_message"] = message
    return type.__new__(_Absent, qualname, (), namespace)
'''


# ---------------------------------------------------------------- reading the package


_PARSE = threading.Lock()  # this module's caches and builds (parsing has its own lock)


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse``, one thread at a time: Python 3.11 keeps the AST conversion's
    recursion depth per interpreter, and two grading threads (``--jobs 2``) parsing at
    once can fail with "SystemError: AST constructor recursion depth mismatch"."""
    from ..checks._scan import parse as locked_parse  # one lock for every parse

    return locked_parse(source, filename=filename)


@dataclass
class _Module:
    name: str  # dotted
    path: Path
    source: str
    tree: ast.Module
    is_package: bool
    defs: dict[str, ast.AST] = field(default_factory=dict)  # top-level def/class by name
    values: dict[str, list[ast.AST]] = field(default_factory=dict)  # other bindings
    # local name -> ("module", dotted) or ("symbol", module, name)
    imports: dict[str, tuple] = field(default_factory=dict)


def _module_name(root: Path, path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


_READ: dict[tuple, dict] = {}


def _read(root: Path) -> dict[str, _Module]:
    """Every module of the package at ``root``, parsed (once per content)."""
    key = (str(root), package_hash(root))
    with _PARSE:
        found = _READ.get(key)
    if found is None:
        found = _read_now(root)
        with _PARSE:
            _READ[key] = found
    return found


def _read_now(root: Path) -> dict[str, _Module]:
    modules: dict[str, _Module] = {}
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        name, is_package = _module_name(root, path)
        source = path.read_text(encoding="utf-8")
        tree = parse(source, str(path))
        modules[name] = _Module(name, path, source, tree, is_package)
    for module in modules.values():
        for node in module.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                module.defs[node.name] = node
            else:
                for bound in _bound(node):
                    module.values.setdefault(bound, []).append(node)
        for node in ast.walk(module.tree):  # imports anywhere: one table per module
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                module.imports.update(_imports(node, module, modules))
    return modules


def _bound(node: ast.AST) -> list[str]:
    names = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
            names.append(sub.id)
        elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(sub.name)
    return names


def _imports(node: ast.AST, module: _Module, modules: dict[str, _Module]) -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] != PACKAGE:
                continue
            if alias.asname:
                out[alias.asname] = ("module", alias.name)
            else:
                out[alias.name.split(".")[0]] = ("module", PACKAGE)
        return out
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = module.name if module.is_package else module.name.rpartition(".")[0]
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        base = f"{base}.{node.module}" if node.module else base
    else:
        base = node.module or ""
    if base.split(".")[0] != PACKAGE:
        return out
    for alias in node.names:
        if alias.name == "*":
            continue
        local = alias.asname or alias.name
        if f"{base}.{alias.name}" in modules:
            out[local] = ("module", f"{base}.{alias.name}")
        else:
            out[local] = ("symbol", base, alias.name)
    return out


# ---------------------------------------------------------------- what a symbol uses


def _global_loads(root: ast.AST) -> list[ast.AST]:
    """The ``Name`` loads of ``root`` that read a module-level name (not a local of an
    enclosing function), and the ``Attribute`` nodes on top of them; annotations are
    left out (never needed to run)."""
    from ..checks._scan import _function_locals  # the scan's scopes, with local imports

    out: list[ast.AST] = []
    todo: list[tuple[ast.AST, tuple[frozenset, ...]]] = [(root, ())]
    while todo:
        node, scopes = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            outer = [*getattr(node, "decorator_list", []), *node.args.defaults]
            outer += [d for d in node.args.kw_defaults if d is not None]
            todo += [(child, scopes) for child in outer]
            inner = (*scopes, frozenset(_function_locals(node, imports=True)))
            body = node.body if isinstance(node.body, list) else [node.body]
            todo += [(child, inner) for child in body]
            continue
        if isinstance(node, ast.arg):
            continue  # its annotation
        if isinstance(node, ast.AnnAssign):
            todo += [(c, scopes) for c in (node.target, node.value) if c is not None]
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if not any(node.id in scope for scope in scopes):
                out.append(node)
            continue
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            targets = {
                sub.id
                for gen in node.generators
                for sub in ast.walk(gen.target)
                if isinstance(sub, ast.Name)
            }
            scopes = (*scopes, frozenset(targets))
        todo += [(child, scopes) for child in ast.iter_child_nodes(node)]
    return out


class _Graph:
    """Symbols ``(module, name)`` of the package and what each needs."""

    def __init__(self, modules: dict[str, _Module]) -> None:
        self.modules = modules

    def resolve(self, module: str, name: str, seen: frozenset = frozenset()) -> tuple | None:
        """The defining ``(module, name)`` of ``module.name``: a def, a module-level
        value, or ``("module", dotted)`` for a submodule; None when not the package's."""
        if (module, name) in seen:
            return None
        seen = seen | {(module, name)}
        mod = self.modules.get(module)
        if mod is None:
            return None
        if name in mod.defs or name in mod.values:
            if name in mod.values and name in mod.imports:
                pass  # an import that is rebound below is rare; the value wins
            return (module, name)
        if f"{module}.{name}" in self.modules:
            return ("module", f"{module}.{name}")
        target = mod.imports.get(name)
        if target is None:
            return None
        if target[0] == "module":
            return ("module", target[1])
        return self.resolve(target[1], target[2], seen)

    def _name(self, module: str, node: ast.AST) -> tuple | None:
        """What a load of a module-level name (or ``a.b.c`` on one) in ``module`` is."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        parts.append(node.id)
        parts.reverse()
        mod = self.modules[module]
        if parts[0] in mod.defs or parts[0] in mod.values:
            found: tuple | None = (module, parts[0])
        elif parts[0] in mod.imports:
            target = mod.imports[parts[0]]
            found = (
                ("module", target[1])
                if target[0] == "module"
                else self.resolve(target[1], target[2])
            )
        else:
            return None
        for attr in parts[1:]:
            if found is None or found[0] != "module":
                break
            found = self.resolve(found[1], attr)
        return found if found is not None and found[0] != "module" else None

    def needs(self, symbol: tuple) -> set[tuple]:
        """The symbols a def, class or module-level value uses."""
        module, name = symbol
        mod = self.modules[module]
        nodes = [mod.defs[name]] if name in mod.defs else mod.values.get(name, [])
        out: set[tuple] = set()
        for node in nodes:
            out |= self._uses(module, node)
        out.discard(symbol)
        return out

    def _uses(self, module: str, node: ast.AST) -> set[tuple]:
        out: set[tuple] = set()
        loads = {id(n) for n in _global_loads(node)}
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Import, ast.ImportFrom)):
                for target in _imports(sub, self.modules[module], self.modules).values():
                    if target[0] == "symbol":
                        found = self.resolve(target[1], target[2])
                        if found is not None and found[0] != "module":
                            out.add(found)
            elif isinstance(sub, ast.Attribute) and id(_base(sub)) in loads:
                found = self._name(module, sub)
                if found is not None:
                    out.add(found)
            elif isinstance(sub, ast.Name) and id(sub) in loads:
                found = self._name(module, sub)
                if found is not None:
                    out.add(found)
        return out

    def import_time(self) -> set[tuple]:
        """What module-level statements call, read an attribute of or subclass while the
        package is imported (stubbed, the import would fail)."""
        out: set[tuple] = set()
        for module in self.modules.values():
            for node in module.tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    continue
                if _is_main_guard(node):
                    continue  # run as a script (``python -m``), not on import
                loads = {id(n) for n in _global_loads(node)}
                for sub in ast.walk(node):
                    if isinstance(sub, ast.Call):
                        target = sub.func
                    elif isinstance(sub, ast.Attribute) and not (
                        sub.attr.startswith("__") and sub.attr.endswith("__")
                    ):
                        target = sub.value
                    else:
                        continue
                    if id(_base(target)) in loads:
                        found = self._name(module.name, target)
                        if found is not None and found[1] in self.modules[found[0]].defs:
                            out.add(found)  # a value is evaluated anyway: only defs
        return out

    def closure(self, roots: set[tuple]) -> set[tuple]:
        """``roots`` and what they need, transitively; never a checker (`_is_checker`):
        a checker holds and calls the reference, and runs only on the grader's side."""
        done: set[tuple] = set()
        todo = list(roots)
        while todo:
            symbol = todo.pop()
            if symbol in done or symbol[0] not in self.modules or _is_checker(".".join(symbol)):
                continue
            done.add(symbol)
            todo += [n for n in self.needs(symbol) if not _stores_checker(symbol, n)]
        return done


def _stores_checker(symbol: tuple, need: tuple) -> bool:
    """Whether ``symbol``, reference code, refers to the checkers' machinery
    (``attention_course.checks``): the quiz's question table stores each question's cases,
    which it never runs in the kernel. Such a use is not followed; the grader's own kernel
    side (``attention_course.grading``) and the checks among themselves are."""
    checks = f"{PACKAGE}.checks"
    inside = need[0] == checks or need[0].startswith(checks + ".")
    own = symbol[0].startswith((checks + ".", f"{PACKAGE}.grading.")) or symbol[0] == checks
    return inside and not own


def _is_main_guard(node: ast.AST) -> bool:
    """``if __name__ == "__main__":``"""
    test = getattr(node, "test", None)
    return (
        isinstance(node, ast.If)
        and isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
    )


def _base(node: ast.AST) -> ast.AST:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


# ---------------------------------------------------------------- the plan


def _is_checker(path: str) -> bool:
    """``attention_course.checks.check_x`` or ``attention_course.quiz.check_quiz``: run by the
    grader on its side, never needed in the kernel (the check cells are skipped)."""
    last = path.rsplit(".", 1)[-1]
    return last.startswith("check_") and (
        path.startswith(f"{PACKAGE}.checks.") or path.startswith(f"{PACKAGE}.quiz.")
    )


def handed_out(exercise: str, given: dict | None = None) -> list[str]:
    """The dotted names the exercise's given cells import, less the checkers."""
    if given is None:
        from .release import released_given

        given = released_given().get(exercise, {})
    return sorted(p for p in given.get("allowed", ()) if not _is_checker(p))


@dataclass
class Plan:
    """What :func:`build` keeps real for one exercise."""

    exercise: str
    gives: list[str]  # the dotted names handed out
    real: set[tuple]  # (module, name) kept as they are
    stubs: dict[str, list[str]]  # module -> the top-level defs made stubs
    public: dict[tuple, str]  # (module, name) -> the name the package exports it as


def plan(exercise: str, root: Path | None = None, given: dict | None = None) -> Plan:
    """Which top-level functions and classes stay real for ``exercise``."""
    root = Path(root or Path(__file__).resolve().parent.parent)
    graph = _Graph(_read(root))
    gives = handed_out(exercise, given)
    roots: set[tuple] = set(KERNEL_ROOTS) | graph.import_time()
    for path in gives:
        if path in SERVED:  # the grader makes and runs it: a stub in the build
            continue
        module, _, name = path.rpartition(".")
        found = graph.resolve(module, name)
        if found is not None and found[0] != "module":
            roots.add(found)
    real = graph.closure(roots)
    stubs: dict[str, list[str]] = {}
    for module in graph.modules.values():
        for name in module.defs:
            if (module.name, name) not in real:
                stubs.setdefault(module.name, []).append(name)
    public = {}
    init = graph.modules[PACKAGE]
    for local in set(init.imports) | set(init.defs):
        found = graph.resolve(PACKAGE, local)
        if found is not None and found[0] != "module":
            public.setdefault(found, f"{PACKAGE}.{local}")
    return Plan(exercise, gives, real, stubs, public)


def real_targets(
    exercise: str,
    tasks: list[dict] | None = None,
    root: Path | None = None,
    given: dict | None = None,
) -> list[tuple[str, str]]:
    """The exercise's own task targets that stay real in its build (in the closure of a
    name it hands out): ``[(task name, "module.name"), ...]``."""
    if tasks is None:
        from .release import released_tasks

        tasks = released_tasks().get(exercise, [])
    root = Path(root or Path(__file__).resolve().parent.parent)
    the_plan = plan(exercise, root, given)
    graph = _Graph(_read(root))
    out = []
    for task in tasks:
        found = graph.resolve(PACKAGE, task["name"])
        if found is not None and found[0] != "module" and found in the_plan.real:
            out.append((task["name"], ".".join(found)))
    return out


# ---------------------------------------------------------------- the build


def _stub_source(module: _Module, names: list[str], the_plan: Plan) -> str:
    lines = module.source.splitlines(keepends=True)
    gives = ", ".join(the_plan.gives) or "nothing of the package"
    spans = []
    for name in names:
        node = module.defs[name]
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        kind = "cls" if isinstance(node, ast.ClassDef) else "function"
        shown = the_plan.public.get((module.name, name), f"{module.name}.{name}")
        text = f"{name} = _absent_.{kind}({module.name!r}, {name!r}, {shown!r}, {gives!r})\n"
        why = SERVED.get(f"{module.name}.{name}")
        if why is not None:
            text = f"{name} = _absent_.served({module.name!r}, {name!r}, {shown!r}, {why!r})\n"
        spans.append((first, node.end_lineno or node.lineno, text))
    for first, last, text in sorted(spans, reverse=True):
        lines[first - 1 : last] = [text]
    # the helper, imported after the docstring and ``from __future__`` imports
    at = 0
    for node in module.tree.body:
        is_doc = (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            and node is module.tree.body[0]
        )
        if is_doc or (isinstance(node, ast.ImportFrom) and node.module == "__future__"):
            at = node.end_lineno or node.lineno
            continue
        break
    lines.insert(at, f"import {PACKAGE}.{RUNTIME_MODULE} as _absent_\n")
    return "".join(lines)


def build(
    exercise: str, dest: str | Path, root: str | Path | None = None, given: dict | None = None
) -> Path:
    """Write ``exercise``'s build of the package into ``dest`` (made, must not exist) and
    return the package folder (``dest/attention_course``), to bind read-only in the
    sandbox (`attention_course.grading.isolation.command`'s ``package``). ``given``: the
    exercise's given code (`attention_course.grading.cheats.given_code`; default: as
    released)."""
    root = Path(root or Path(__file__).resolve().parent.parent)
    the_plan = plan(exercise, root, given)
    modules = _read(root)
    out = Path(dest) / PACKAGE
    shutil.copytree(
        root,
        out,
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.py"),
    )
    for module in modules.values():
        target = out / module.path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        names = the_plan.stubs.get(module.name, [])
        text = _stub_source(module, names, the_plan) if names else module.source
        target.write_text(text, encoding="utf-8")
    (out / f"{RUNTIME_MODULE}.py").write_text(_RUNTIME, encoding="utf-8")
    for path in [out, *out.rglob("*")]:  # readable by the sandbox's user, never writable
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return out


def package_hash(root: str | Path | None = None) -> str:
    """A hash of the package's files (a change of any rebuilds)."""
    root = Path(root or Path(__file__).resolve().parent.parent)
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if "__pycache__" in path.parts or not path.is_file() or path.suffix == ".pyc":
            continue
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


class Builds:
    """The builds of one grading run, by (exercise, what it gives, package hash), in one
    temporary folder removed by :meth:`remove`."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root or Path(__file__).resolve().parent.parent)
        self.folder = Path(tempfile.mkdtemp(prefix="ac-absent-"))
        os.chmod(self.folder, 0o755)
        self.made: dict[tuple, Path] = {}
        self.targets: dict[tuple, set] = {}
        self.lock = threading.Lock()  # grading threads (--jobs) share one run's builds

    def get(self, exercise: str, given: dict | None = None) -> Path:
        """The package folder of ``exercise``'s build (made on first use)."""
        gives = ",".join(handed_out(exercise, given))
        key = (exercise, hashlib.sha256(gives.encode()).hexdigest()[:8], package_hash(self.root))
        with self.lock:
            if key not in self.made:
                dest = self.folder / "-".join(key)
                self.made[key] = build(exercise, dest, self.root, given)
            return self.made[key]

    def real_targets(self, exercise: str, tasks: list[dict], given: dict | None = None) -> set:
        """The names of ``tasks`` that stay real in ``exercise``'s build (`real_targets`)."""
        gives = tuple(handed_out(exercise, given))
        key = (exercise, gives, tuple(t["name"] for t in tasks))
        with self.lock:
            if key not in self.targets:
                found = real_targets(exercise, tasks, self.root, given)
                self.targets[key] = {name for name, _ in found}
            return self.targets[key]

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


_RUN: dict = {}


def prepare() -> None:
    """Parse the package now, in this thread (before a class run starts its grading
    threads): the builds then only read the parsed modules."""
    _read(Path(__file__).resolve().parent.parent)


def for_run() -> Builds:
    """The builds of this grading run (one per process), removed at exit."""
    with _PARSE:
        if "builds" not in _RUN:
            import atexit

            _RUN["builds"] = Builds()
            atexit.register(_RUN["builds"].remove)
        return _RUN["builds"]
