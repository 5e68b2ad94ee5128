"""The static scan of a notebook's code: what a task's solution uses that is not its own.

Used on both sides, so that the check cell and the grader judge a task by the same rules
(one policy per task: :mod:`attention_course.checks._policy`):

- in the check cell, by the checkers (the cells the kernel ran, IPython's ``In``);
- in the grader, `attention_course.grading.cheats` (the submitted notebook's cells).

The AST of each task's solution cell, and of every function, class and alias of the
notebook that it uses (transitively), is searched for

* the reference package, ``attention_course``, in any spelling: ``ac.x`` after
  ``import attention_course as ac``, ``from attention_course.attention import x as
  mine``, ``importlib.import_module("attention_course...")``, ``__import__(...)``,
  ``getattr(ac, "x")``, ``sys.modules[...]``. Names that the notebook's *given* cells
  (not solution cells) import by name from ``attention_course`` are building blocks
  the exercise hands out (exercise 6 gives ``scaled_dot_product_attention`` to
  multi-head attention) and are allowed, except the task's own target;
* imports whose module name is not a constant (``__import__("attention_" + "course")``),
  ``exec``/``eval``/``compile``, ``getattr`` of a module with a computed name: the
  scan cannot see what they reach, so they are flagged as such (notes for the instructor:
  only a reference or a forbidden built-in costs points, `_policy.breaks_policy`);
* the PyTorch built-ins that a task forbids, declared next to each checker
  (``@checker(..., forbidden=("torch.nn.functional.layer_norm", ...))``);
* a class built on the reference (``class LayerNorm(ac.LayerNorm): pass``).

The scan starts from the task's solution cell *and* every other cell that binds the
task's name (a definition in a cell of its own, after the check cell, replaces the
solution cell's).
"""

from __future__ import annotations

import ast
import importlib
import threading
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

REFERENCE = "attention_course"
DYNAMIC_CALLS = {
    "importlib.import_module": "imports a module by a name computed at run time",
    "__import__": "imports a module by a name computed at run time",
    "importlib.__import__": "imports a module by a name computed at run time",
    "exec": "runs code from a string",
    "eval": "runs code from a string",
    "compile": "compiles code from a string",
}
# Profile and trace hooks (what switched off the in-kernel watch this scan once served;
# that watch is deleted, and a hook is now a note for the instructor)
WATCH_SWITCHES = (
    "sys.setprofile",
    "sys.settrace",
    "sys.monitoring",
    "sys._setprofileallthreads",
    "sys._settraceallthreads",
    "threading.setprofile",
    "threading.settrace",
    "threading.setprofile_all_threads",
    "threading.settrace_all_threads",
)
# The grader's own modules: a notebook that names one tampers with the grader
# (its modules first, then the subpackage itself: the first that matches is named)
MACHINERY = (
    *(
        f"{REFERENCE}.grading.{name}"
        for name in ("cheats", "sandbox", "_kernel", "grade", "gradebook", "isolation")
    ),
    f"{REFERENCE}.grading",
)
# Namespaces that honest code reads by a computed name as an everyday idiom
# (``getattr(F, activation)``, ``getattr(nn, "ReLU")``, ``getattr(nn.init, scheme)``):
# every answer built-in they hand out is one the dynamic watch recognises when it is called,
# whatever name fetched it, so such a read is no finding. A computed read of any other
# module (``sys``, ``torch``, the reference...) still is.
LOOKUP_MODULES = frozenset({"torch.nn.functional", "torch.nn", "torch.nn.init"})


# The prefix of a finding's `what` for a given block that holds the task's answer
HOLDS_ANSWER = "holds the answer: "


@dataclass(frozen=True)
class Finding:
    """One use of code that is not the student's, in a task's solution."""

    task: str  # the task's id
    # "reference" and "builtin" (what a task's policy may forbid: `_policy.breaks_policy`),
    # "dynamic" (code the scan cannot follow) and "watch" (a profile or trace hook, or a
    # name of the grader's own modules): those two are notes for the instructor
    kind: str
    cell: int  # the notebook cell index
    line: int  # the line in that cell (1-based), 0 if unknown
    what: str  # the resolved name, e.g. "attention_course.scaled_dot_product_attention"
    code: str = ""  # the line of code
    via: str = ""  # for a built-in reached by its operator's name: that name

    def message(self) -> str:
        where = f"cell {self.cell}, line {self.line}: `{self.code}`" if self.cell >= 0 else ""
        if self.kind == "reference" and self.what.startswith(HOLDS_ANSWER):
            given = self.what.removeprefix(HOLDS_ANSWER)
            text = (
                f"the solution uses `{given.rsplit('.', 1)[-1]}`, which the exercise gives for "
                f"another task: what it makes is built from this task's answer (`{given}` "
                "holds the reference), so this task may not use it: write the class yourself"
            )
        elif self.kind == "reference" and self.what.startswith("built on "):
            base = self.what.removeprefix("built on ")
            text = f"the solution is built on the reference `{base}` instead of its own code"
        elif self.kind == "reference":
            text = f"the solution calls the reference `{self.what}` instead of its own code"
        elif self.kind == "watch" and self.what in MACHINERY:
            text = f"the notebook reaches into the grader's own code (`{self.what}`)"
        elif self.kind == "watch":
            text = f"the solution installs a profile or trace hook (`{self.what}`)"
        elif self.kind == "builtin" and self.via:
            text = (
                f"the solution calls `{self.via}`, the operator behind the built-in "
                f"`{self.what}`, which is the answer itself"
            )
        elif self.kind == "builtin":
            text = f"the solution calls the built-in `{self.what}`, which is the answer itself"
        else:
            text = f"the solution {self.what}, which the grader cannot follow"
        return text + (f" ({where})" if where else "")

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- static scan


_PARSE = threading.Lock()


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse``, one thread at a time, for every parse the checks and the grader make:
    Python 3.11 keeps the AST conversion's recursion depth per interpreter, and two grading
    threads (``--jobs 2``) parsing at once can fail with "SystemError: AST constructor
    recursion depth mismatch" (seen in a CI rehearsal: the static scan parsed while another
    thread's grader parsed)."""
    with _PARSE:
        return ast.parse(source, filename=filename)


def _source(cell: Any) -> str:
    """A code cell's source with IPython magics and shell lines blanked (same lines)."""
    lines = []
    for line in cell.get("source", "").splitlines():
        stripped = line.lstrip()
        lines.append("" if stripped.startswith(("%", "!")) else line)
    return "\n".join(lines)


def _dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` -> ["a", "b", "c"]; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def _base_name(node: ast.AST) -> ast.AST:
    """The ``a`` of ``a.b.c``."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def _const_str(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


class _Notebook:
    """What each code cell of a notebook defines and imports.

    ``live_only``: a task's definitions are the *last* bindings of its names, in cell order
    (a function defined, then redefined in a later cell or a later run of the same cell;
    a name first bound to a lambda, an alias or an import, then to a ``def``: only the last
    binding is what runs). A top-level statement every one of whose names is bound again
    later is then no root and no definition (:attr:`live`); a decorated ``def`` or
    ``class`` always stays (its decorator may have registered it: ``singledispatch``).
    :attr:`trees` keeps every statement, for what any cell does (``_scan_anywhere``).
    Both sides of a task's policy scan this way: the grader, the saved notebook's cells
    top to bottom; the check cell, the kernel's history, where every run of an edited
    cell is kept (`attention_course.checks._policy`)."""

    def __init__(self, nb: Any, skip: set[int], live_only: bool = False):
        self.trees: dict[int, ast.Module] = {}
        self.lines: dict[int, list[str]] = {}
        self.defs: dict[str, list[tuple[int, ast.AST]]] = {}  # top-level name -> nodes
        for index, cell in enumerate(nb.cells):
            if cell.get("cell_type") != "code" or index in skip:
                continue
            source = _source(cell)
            try:
                tree = parse(source)
            except (SyntaxError, ValueError):
                continue
            self.trees[index] = tree
            self.lines[index] = source.splitlines()
        last: dict[str, tuple[int, int]] = {}  # name -> (cell, statement) of its last binding
        for index in sorted(self.trees):
            for position, node in enumerate(self.trees[index].body):
                for name in _bound_names(node):
                    last[name] = (index, position)

        def is_live(index: int, position: int, node: ast.AST) -> bool:
            names = _bound_names(node)
            if not live_only or not names:
                return True
            if getattr(node, "decorator_list", None):
                return True
            return any(last[name] == (index, position) for name in names)

        self.live: dict[int, ast.Module] = {
            index: ast.Module(
                body=[n for i, n in enumerate(tree.body) if is_live(index, i, n)],
                type_ignores=[],
            )
            for index, tree in self.trees.items()
        }
        for index, tree in self.live.items():
            for node in tree.body:
                for name in _bound_names(node):
                    self.defs.setdefault(name, []).append((index, node))

    def aliases(self, cells: Iterable[int], live: bool = False) -> dict[str, str]:
        """Module-level import aliases of ``cells``: local name -> dotted path (``live``:
        of the live statements only)."""
        trees = self.live if live else self.trees
        out: dict[str, str] = {}
        for index in cells:
            for node in ast.walk(trees.get(index, ast.Module(body=[]))):
                out.update(_import_aliases(node))
        return out


def _bound_names(node: ast.AST) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return list(_import_aliases(node))
    targets: list[ast.AST] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    names = []
    for target in targets:
        for sub in ast.walk(target):
            if isinstance(sub, ast.Name):
                names.append(sub.id)
    return names


def _import_aliases(node: ast.AST) -> dict[str, str]:
    out: dict[str, str] = {}
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.asname:
                out[alias.asname] = alias.name
            else:
                top = alias.name.split(".")[0]
                out[top] = top
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        for alias in node.names:
            if alias.name != "*":
                out[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return out


# Modules a cheat can reach as another module's attribute (``F.importlib``, ``torch.sys``)
_REACHABLE = ("sys", "importlib", "builtins")


def _resolve(parts: list[str], aliases: dict[str, str]) -> str:
    head = aliases.get(parts[0])
    parts = [*head.split("."), *parts[1:]] if head else list(parts)
    for i in range(1, len(parts)):  # torch.nn.functional.importlib.x is importlib.x
        if parts[i] in _REACHABLE:
            return ".".join(parts[i:])
    return ".".join(parts)


def _normalise(path: str) -> str:
    """Spellings of the same torch object: ``torch.nn.functional.x`` == ``F.x`` resolved."""
    return path.replace("torch.nn.modules.", "torch.nn.").replace(
        "torch.nn.normalization.", "torch.nn."
    )


# Where PyTorch keeps the operators behind its functions: ``torch.ops.aten.layer_norm``,
# ``torch._C._nn.scaled_dot_product_attention``, ``torch._VF``... (and ``torch.<op>``)
_OPERATOR_HOMES = ("torch.ops.", "torch._C.", "torch._VF.", "torch._ops.")


def _words(name: str) -> set[str]:
    """``"_native_layer_norm"`` -> {"native", "layer", "norm"}; ``"LayerNorm"`` -> {"layer",
    "norm"}."""
    spaced = "".join(f"_{c.lower()}" if c.isupper() else c for c in name)
    return {word for word in spaced.split("_") if word}


def _operator_match(path: str, builtins: Sequence[str]) -> str | None:
    """The answer built-in that the operator ``path`` (under `_OPERATOR_HOMES`) computes:
    its name has every word of the built-in's (``_scaled_dot_product_flash_attention``,
    ``native_layer_norm``) or contains it (``_native_multi_head_attention``)."""
    parts = path.split(".")
    op = parts[3] if path.startswith("torch.ops.") and len(parts) > 3 else parts[-1]
    for builtin in builtins:
        name = builtin.rsplit(".", 1)[-1]
        compact = name.lower().replace("_", "")
        if _words(name) <= _words(op) or compact in op.lower().replace("_", ""):
            return builtin
    return None


def _matches_builtin(path: str, builtins: Sequence[str]) -> str | None:
    path = _normalise(path)
    if path.startswith(_OPERATOR_HOMES) or (path.startswith("torch.") and path.count(".") == 1):
        # torch._scaled_dot_product_attention_math, torch._native_multi_head_attention...
        exact = [b for b in builtins if path == b or path.startswith(b + ".")]
        return exact[0] if exact else _operator_match(path, builtins)
    for builtin in builtins:
        if path == builtin or path.startswith(builtin + "."):
            return builtin
        # torch.nn.LayerNorm is also torch.nn.modules.normalization.LayerNorm
        if builtin.startswith("torch.nn.") and path.startswith("torch.nn."):
            if path.rsplit(".", 1)[-1] == builtin.rsplit(".", 1)[-1] and "functional" not in (
                path + builtin
            ):
                return builtin
    return None


def _statement_hash(node: ast.AST) -> str:
    """A top-level statement's identity, whatever its layout, comments or position."""
    import hashlib

    return hashlib.sha256(ast.dump(node).encode("utf-8")).hexdigest()


def given_code(nb: Any) -> dict[str, list[str]]:
    """What a student copy gives (`attention-course release` stores it per exercise):
    ``statements``, the hashes of the top-level statements of its code cells that are
    neither solution nor check cells, and ``allowed``, the reference paths those cells
    import (the building blocks the exercise hands out)."""
    skip = set()
    for index, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("solution") or meta.get("grade"):
            skip.add(index)
    book = _Notebook(nb, skip)
    statements = {_statement_hash(node) for tree in book.trees.values() for node in tree.body}
    paths = {p for p in book.aliases(book.trees).values() if p.startswith(REFERENCE + ".")}
    return {"statements": sorted(statements), "allowed": sorted(paths)}


def _exempt_lines(book: _Notebook, cells: Iterable[int], statements: set[str]) -> dict:
    """cell -> the lines of its top-level statements that the exercise gave verbatim."""
    out: dict[int, set[int]] = {}
    for index in cells:
        for node in book.trees[index].body:
            if _statement_hash(node) in statements:
                end = getattr(node, "end_lineno", node.lineno) or node.lineno
                out.setdefault(index, set()).update(range(node.lineno, end + 1))
    return out


def scan_notebook(
    nb: Any, tasks: Sequence[dict], given: dict | None = None
) -> dict[str, list[Finding]]:
    """The findings of every task, by task id (tasks without findings are left out)."""
    from ..checks import CHECKERS

    cell_index = {}
    solution_cells = set()
    check_cells = set()
    for index, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade_id"):
            cell_index[meta["grade_id"]] = index
        if meta.get("solution"):
            solution_cells.add(index)
        elif meta.get("grade") and cell.get("cell_type") == "code":
            check_cells.add(index)
    for task in tasks:
        if task.get("solution_cell") in cell_index:
            solution_cells.add(cell_index[task["solution_cell"]])
    book = _Notebook(nb, check_cells, live_only=True)
    others = [i for i in book.trees if i not in solution_cells]
    exempt: dict[int, set[int]] = {}
    if given is None:  # no released record (an instructor's notebook): trust its cells
        handed_out = set(book.aliases(others).values())
    else:  # the exercise's own statements and imports, as released
        handed_out = set(given.get("allowed", ()))
        exempt = _exempt_lines(book, others, set(given.get("statements", ())))
    everything = book.aliases(book.trees, live=True)  # a task's own code: live bindings

    used: set[int] = set()  # the cells some task's solution uses
    for task in tasks:
        index = cell_index.get(task.get("solution_cell"))
        index = index if index in book.trees else None
        used.update(cell for cell, _ in _closure(book, _roots(book, index, task["name"])))
    anywhere = _scan_anywhere(book, book.aliases(book.trees), used)
    out: dict[str, list[Finding]] = {}
    for task in tasks:
        index = cell_index.get(task.get("solution_cell"))
        if index not in book.trees:  # no solution cell (its metadata deleted?): its name
            index = None
            if task["name"] not in book.defs:
                continue
        checker = CHECKERS.get(str(task.get("checker", "")).removeprefix("check_"))
        if "answer_builtins" in task:  # the task's policy record, as released
            builtins = tuple(task["answer_builtins"])
        else:
            builtins = tuple(getattr(checker, "answer_builtins", ()))
        own = {task["name"], str(task.get("checker", "")).removeprefix("check_")}
        # given blocks made of this task's target (the checker's `holds_answer`)
        holds = set(getattr(checker, "holds_answer", ()))
        allowed = {
            path
            for path in handed_out
            if path.startswith(REFERENCE + ".")
            and path.rsplit(".", 1)[-1] not in own
            and path not in holds
        }
        findings = _scan_task(
            task, index, book, everything, allowed, builtins, own, anywhere, exempt, holds
        )
        if findings:
            out[task.get("id", task["name"])] = findings
    return out


def allowed_names(nb: Any, task: dict, given: dict | None = None) -> list[str]:
    """The reference names the exercise hands out, less the task's own: ``given``'s
    ``allowed`` paths (`given_code`, as released), else the imports of the notebook's
    non-solution cells."""
    solution = set()
    check = set()
    for index, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("solution"):
            solution.add(index)
        elif meta.get("grade"):
            check.add(index)
    book = _Notebook(nb, check)
    own = {task["name"], str(task.get("checker", "")).removeprefix("check_")}
    if given is None:
        paths = set(book.aliases(i for i in book.trees if i not in solution).values())
    else:
        paths = set(given.get("allowed", ()))
    names = {
        path.rsplit(".", 1)[-1]
        for path in paths
        if path.startswith(REFERENCE + ".") and ".checks" not in path
    }
    return sorted(names - own)


def dependencies(nb: Any, tasks: Sequence[dict]) -> dict[str, set[int]]:
    """The cells whose top-level definitions each task's solution uses, transitively."""
    cell_index = {
        c.get("metadata", {}).get("nbgrader", {}).get("grade_id"): i for i, c in enumerate(nb.cells)
    }
    book = _Notebook(nb, set())
    out = {}
    for task in tasks:
        index = cell_index.get(task.get("solution_cell"))
        if index is None:
            continue
        seen_cells = {index}
        for cell, _node in _closure(book, _roots(book, index, task["name"])):
            seen_cells.add(cell)
        out[task.get("id", task["name"])] = seen_cells
    return out


def _closure(book: _Notebook, roots: list[tuple[int, ast.AST | None]]):
    """(cell, node) for the roots and every top-level definition they use, transitively."""
    todo = [(c, n) for c, n in roots if n is not None]
    seen: set[int] = set()
    while todo:
        cell, node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield cell, node
        local = _local_names(node)
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load) and sub.id not in local:
                for def_cell, def_node in book.defs.get(sub.id, []):
                    if not isinstance(def_node, (ast.Import, ast.ImportFrom)):
                        todo.append((def_cell, def_node))


def _roots(book: _Notebook, index: int | None, name: str) -> list[tuple[int, ast.AST | None]]:
    """The solution cell, and every top-level statement of another cell that binds the
    task's ``name``: the object graded is the last one bound, wherever that is."""
    roots: list[tuple[int, ast.AST | None]] = []
    if index is not None:
        roots.append((index, book.live.get(index)))
    for cell, node in book.defs.get(name, []):
        if cell != index:
            roots.append((cell, node))
    return roots


def _local_names(node: ast.AST) -> set[str]:
    """Names bound inside ``node`` (arguments, assignments, loop variables, inner defs):
    a use of one of them is not a use of a notebook-level definition."""
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.arg):
            names.add(sub.arg)
        elif isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
            names.add(sub.id)
        elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if sub is not node:
                names.add(sub.name)
    return names


def _function_locals(func: ast.AST, *, imports: bool = False) -> set[str]:
    """The names local to a function or lambda: its parameters and what its own body binds
    (assignments, loop and ``with`` targets, inner ``def``/``class``, ``except ... as``;
    with ``imports``, the names its own imports bind), less what it declares ``global``
    or ``nonlocal``. Comprehensions have scopes of their own and are left out.

    The scan leaves imports out (an ``import attention_course as ac`` inside a solution
    is resolved as an alias, so that ``ac.x`` is still seen); the grader's absent build
    (`attention_course.grading.absent`) counts them (a local import is not a use of a
    module-level name)."""
    args = func.args  # type: ignore[attr-defined]
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    names = {a.arg for a in every if a is not None}
    declared: set[str] = set()
    body = func.body  # type: ignore[attr-defined]
    todo = list(body) if isinstance(body, list) else [body]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            todo += node.decorator_list
            continue
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp)):
            continue
        if isinstance(node, ast.GeneratorExp):
            continue
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            declared.update(node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif imports and isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        todo += ast.iter_child_nodes(node)
    return names - declared


def _shadowed(root: ast.AST) -> set[int]:
    """The ids of the ``Name`` loads of ``root`` that read a variable of an enclosing
    function (``softmax = e / e.sum()`` then ``return softmax``): by Python's scoping they
    are the function's own, whatever an import of the same name in some cell says."""
    out: set[int] = set()
    todo: list[tuple[ast.AST, tuple[frozenset, ...]]] = [(root, ())]
    while todo:
        node, scopes = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            # decorators, defaults and annotations run in the enclosing scope
            outer = [*getattr(node, "decorator_list", []), node.args]
            if getattr(node, "returns", None) is not None:
                outer.append(node.returns)  # type: ignore[union-attr]
            todo += [(child, scopes) for child in outer]
            inner = (*scopes, frozenset(_function_locals(node)))
            body = node.body if isinstance(node.body, list) else [node.body]
            todo += [(child, inner) for child in body]
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if any(node.id in scope for scope in scopes):
                out.add(id(node))
        todo += [(child, scopes) for child in ast.iter_child_nodes(node)]
    return out


def _canonical(path: str) -> str:
    """A reference reached by its module path, as the package exports it:
    ``attention_course.multihead.MultiHeadAttention`` is ``attention_course.MultiHeadAttention``
    when both name the same object (a given building block imported by its module path
    is the same building block). Any other path is returned as it is."""
    module, _, name = path.rpartition(".")
    if not module.startswith(REFERENCE + "."):
        return path
    try:
        found = getattr(importlib.import_module(module), name)
        exported = getattr(importlib.import_module(REFERENCE), name, None)
    except Exception:  # noqa: BLE001 - not a module path of the package: as it is
        return path
    return f"{REFERENCE}.{name}" if exported is found else path


def _not_given(path: str, allowed: set[str]) -> bool:
    """Whether ``path`` is NOT one of the ``allowed`` references, by its own spelling or as
    the package exports it (`_canonical`)."""
    return path not in allowed and _canonical(path) not in allowed


def _scan_task(
    task: dict,
    index: int | None,
    book: _Notebook,
    aliases: dict[str, str],
    allowed: set[str],
    builtins: Sequence[str],
    own: set[str],
    anywhere: Sequence[tuple[str, int, ast.AST, str]] = (),
    exempt: dict[int, set[int]] | None = None,
    holds: set[str] = frozenset(),
) -> list[Finding]:
    task_id = task.get("id", task["name"])
    findings: dict[tuple, Finding] = {}

    def add(kind: str, cell: int, node: ast.AST, what: str, via: str = "") -> None:
        line = getattr(node, "lineno", 0)
        if line in (exempt or {}).get(cell, ()):  # a statement the exercise gave, verbatim
            return
        code = book.lines[cell][line - 1].strip() if 0 < line <= len(book.lines[cell]) else ""
        finding = Finding(task_id, kind, cell, line, what, code, via)
        findings.setdefault((kind, what, cell, line), finding)

    for kind, cell, node, what in anywhere:  # what any cell does to the grader: every task's
        add(kind, cell, node, what)

    def check_path(path: str, cell: int, node: ast.AST) -> None:
        if path == REFERENCE or path.startswith(REFERENCE + "."):
            if path in holds or _canonical(path) in holds:
                add("reference", cell, node, f"{HOLDS_ANSWER}{path}")
            elif _not_given(path, allowed) or path.rsplit(".", 1)[-1] in own:
                add("reference", cell, node, path)
            return
        builtin = _matches_builtin(path, builtins)
        if builtin:
            plain = _normalise(path)
            same = plain == builtin or plain.startswith(builtin + ".")
            add("builtin", cell, node, builtin, "" if same else plain)

    def check_watch(path: str, cell: int, node: ast.AST) -> None:
        for switch in WATCH_SWITCHES:
            if path == switch or path.startswith(switch + "."):
                add("watch", cell, node, switch)

    method_builtins = {b.rsplit(".", 1)[-1] for b in builtins if b.startswith("torch.Tensor.")}
    for cell, root in _closure(book, _roots(book, index, task["name"])):
        local = dict(aliases)
        shadow = _shadowed(root)  # a function's own variables, not the imports they mirror
        bases = set()  # the `ac` of `ac.x`: judged with its attribute, not alone
        class_bases = set()  # judged as "built on" by their class
        for sub in ast.walk(root):
            local.update(_import_aliases(sub))
            if isinstance(sub, ast.Attribute):
                bases.add(id(sub.value))
            if isinstance(sub, ast.ClassDef):
                class_bases.update(id(b) for b in sub.bases)
        for sub in ast.walk(root):
            if id(sub) in class_bases:
                parts = _dotted(sub)
                path = _resolve(parts, local) if parts is not None else ""
                if path == REFERENCE or path.startswith(REFERENCE + "."):
                    if _not_given(path, allowed) or path.rsplit(".", 1)[-1] in own:
                        add("reference", cell, sub, f"built on {path}")
                    continue
                if parts is not None:  # a built-in base (class Mine(nn.LayerNorm))
                    check_path(path, cell, sub)
                    continue
            if isinstance(sub, (ast.Import, ast.ImportFrom)):
                for path in _import_aliases(sub).values():
                    check_path(path, cell, sub)
            elif isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Load):
                parts = _dotted(sub)
                if parts is not None and id(_base_name(sub)) in shadow:
                    parts = None  # `x.softmax` with `x` a variable of the function's
                if parts is not None:
                    check_path(_resolve(parts, local), cell, sub)
                    check_watch(_resolve(parts, local), cell, sub)
                    if _resolve(parts, local) == "sys.modules":  # torch.sys.modules too
                        add("dynamic", cell, sub, "reads `sys.modules`")
                if sub.attr in method_builtins and (parts is None or parts[0] not in local):
                    add("builtin", cell, sub, f"torch.Tensor.{sub.attr}")
            elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                if sub.id in local and id(sub) not in bases and id(sub) not in shadow:
                    check_path(local[sub.id], cell, sub)
                    check_watch(local[sub.id], cell, sub)
            if isinstance(sub, ast.Call):
                _check_call(sub, cell, local, add, check_path)
                _check_call(sub, cell, local, add, check_watch)
    return sorted(findings.values(), key=lambda f: (f.cell, f.line, f.kind))


def _scan_anywhere(book: _Notebook, aliases: dict[str, str], used: set[int]) -> list[tuple]:
    """What a code cell does that changes the grader or that the grader cannot follow,
    for every task: ``(kind, cell, node, what)``.

    A cell that no task uses still runs in the kernel before the checks, so the grader's
    own modules (`MACHINERY`) are flagged in any cell; the watch switches
    and code run from strings or imports by computed names in the cells that no task's
    solution uses (`used`; in those it uses, they are that task's findings)."""
    out: list[tuple] = []

    def add(kind: str, cell: int, node: ast.AST, what: str) -> None:
        if cell not in used or what in MACHINERY:
            out.append((kind, cell, node, what))

    def check_path(path: str, cell: int, node: ast.AST) -> None:
        for module in MACHINERY:
            if path == module or path.startswith(module + "."):
                add("watch", cell, node, module)
                break
        for switch in WATCH_SWITCHES:
            if path == switch or path.startswith(switch + "."):
                add("watch", cell, node, switch)

    for cell, tree in book.trees.items():
        local = dict(aliases)
        for sub in ast.walk(tree):
            local.update(_import_aliases(sub))
        for sub in ast.walk(tree):
            if isinstance(sub, (ast.Import, ast.ImportFrom)):
                for path in _import_aliases(sub).values():
                    check_path(path, cell, sub)
            elif isinstance(sub, ast.Attribute):
                parts = _dotted(sub)
                if parts is not None:
                    check_path(_resolve(parts, local), cell, sub)
                    if _resolve(parts, local) == "sys.modules" or (
                        parts[0] == "sys" and parts[1:2] == ["modules"]
                    ):
                        add("dynamic", cell, sub, "reads `sys.modules`")
            elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                if sub.id in local:
                    check_path(local[sub.id], cell, sub)
            if isinstance(sub, ast.Call):
                _check_call(sub, cell, local, add, check_path)
    return out


def _check_call(call: ast.Call, cell: int, aliases: dict[str, str], add, check_path) -> None:
    parts = _dotted(call.func)
    if parts is None:
        return
    path = _resolve(parts, aliases)
    if path in ("importlib.import_module", "__import__", "importlib.__import__"):
        name = _const_str(call.args[0]) if call.args else None
        if name is None:
            what = f"imports a module by a name computed at run time (`{path}`)"
            add("dynamic", cell, call, what)
        else:
            check_path(name, cell, call)
    elif path in ("exec", "eval", "compile"):
        add("dynamic", cell, call, f"runs code from a string (`{path}`)")
    elif path in ("getattr", "builtins.getattr") and len(call.args) >= 2:
        target = _dotted(call.args[0])
        if target is None:
            return
        module = _resolve(target, aliases)
        if target[0] not in aliases:
            return  # an object of the student's (self, a tensor): not a module
        name = _const_str(call.args[1])
        if name is not None:
            check_path(f"{module}.{name}", cell, call)
        elif module not in LOOKUP_MODULES:  # getattr(F, activation): the watch sees the call
            add("dynamic", cell, call, f"reads an attribute of `{module}` by a computed name")
