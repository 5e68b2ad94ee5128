"""Find solutions that are not the student's own: the reference, or the built-in answer.

Two looks, both used by ``attention-course grade``:

- **Static** (`scan_notebook`): the AST of each task's solution cell, and of every
  function, class and alias of the notebook that it uses (transitively), is searched for

  * the reference package, ``attention_course``, in any spelling: ``ac.x`` after
    ``import attention_course as ac``, ``from attention_course.attention import x as
    mine``, ``importlib.import_module("attention_course...")``, ``__import__(...)``,
    ``getattr(ac, "x")``, ``sys.modules[...]``. Names that the notebook's *given* cells
    (not solution cells) import by name from ``attention_course`` are building blocks
    the exercise hands out (exercise 6 gives ``scaled_dot_product_attention`` to
    multi-head attention) and are allowed, except the task's own target;
  * imports whose module name is not a constant (``__import__("attention_" + "course")``),
    ``exec``/``eval``/``compile``, ``getattr`` of a module with a computed name: the
    grader cannot see what they reach, so they are flagged as such;
  * the PyTorch built-ins that *are* the answer, declared next to each checker
    (``@checker(..., answer_builtins=("torch.nn.functional.layer_norm", ...))``);
  * a class built on the reference (``class LayerNorm(ac.LayerNorm): pass``);
  * what switches off the dynamic watch: ``sys.setprofile``, ``threading.setprofile``,
    ``sys.settrace``, ``sys.monitoring``.

  The scan starts from the task's solution cell *and* every other cell that binds the
  task's name (a definition in a cell of its own, after the check cell, replaces the
  solution cell's).

- **Dynamic** (`watch_calls`): while a candidate is evaluated, a profile hook records
  every call of the reference made from the student's code, and every call of an answer
  built-in with student code on the stack (or with ``self`` an instance of a student
  class, for ``class Mine(nn.LayerNorm)``). A call of the reference counts when the first
  frame above it that is neither PyTorch's nor the standard library's is not the
  reference's own (wrappers such as ``functools.partial``, ``singledispatch`` or a thread
  pool hide nothing). It also reports a hook switched off while it watched. It sees what
  the static scan cannot (strings assembled at run time, objects fetched from
  ``globals()``). The kernel side (`attention_course.grading.sandbox`) adds the candidate's
  classes that inherit from the reference (`built_on_reference`).
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Iterable, Sequence
from contextlib import contextmanager

from ..checks._scan import (  # noqa: F401 - the static scan, re-exported
    _OPERATOR_HOMES,
    _REACHABLE,
    ALWAYS_DENIED,
    DYNAMIC_CALLS,
    INHERITS,
    LOOKUP_MODULES,
    MACHINERY,
    REFERENCE,
    WATCH_OFF,
    WATCH_SWITCHES,
    Finding,
    _base_name,
    _bound_names,
    _canonical,
    _check_call,
    _closure,
    _const_str,
    _dotted,
    _exempt_lines,
    _function_locals,
    _import_aliases,
    _local_names,
    _matches_builtin,
    _normalise,
    _not_given,
    _Notebook,
    _operator_match,
    _resolve,
    _roots,
    _scan_anywhere,
    _scan_task,
    _shadowed,
    _source,
    _statement_hash,
    _words,
    allowed_names,
    dependencies,
    given_code,
    scan_notebook,
)

# ---------------------------------------------------------------- dynamic watch


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # attention_course/
_TRUSTED_SUBDIRS = tuple(
    os.path.join(_PACKAGE_DIR, name) for name in ("checks", "grading", "quiz.py")
)


def _resolve_object(path: str):
    """The object a dotted path names, or None."""

    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def _code_objects(obj) -> list:
    if isinstance(obj, type):
        codes = []
        for name in ("__init__", "forward"):
            fn = obj.__dict__.get(name)
            if fn is not None and hasattr(fn, "__code__"):
                codes.append(fn.__code__)
        return codes
    code = getattr(obj, "__code__", None)
    return [code] if code is not None else []


def _is_trusted(filename: str) -> bool:
    return filename.startswith(_TRUSTED_SUBDIRS) or filename.startswith(_STDLIB)


_STDLIB = os.path.dirname(os.path.abspath(threading.__file__)) + os.sep
_SANDBOX = os.path.join(_PACKAGE_DIR, "grading", "sandbox.py")
_TORCH_DIR = ""


def _torch_dir() -> str:
    global _TORCH_DIR
    if not _TORCH_DIR:
        import torch

        _TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    return _TORCH_DIR


def _student_on_stack(frame) -> bool:
    torch_dir = _torch_dir()
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith(torch_dir) or name.startswith(_PACKAGE_DIR) or _is_trusted(name)):
            return not name.startswith("<frozen")
        frame = frame.f_back
    return False


def _student_self(frame) -> bool:
    obj = frame.f_locals.get("self")
    module = type(obj).__module__ if obj is not None else ""
    return bool(module) and not module.startswith(("torch", REFERENCE))


def _is_stdlib(filename: str) -> bool:
    """Python's own library (not the packages installed next to it)."""
    return filename.startswith(_STDLIB) and not any(
        part in filename for part in ("site-packages", "dist-packages")
    )


def _first_caller(frame):
    """The first frame above ``frame`` that is neither PyTorch's nor the standard
    library's: whoever asked, through ``nn.Module.__call__``, ``functools.partial``,
    ``singledispatch``, a thread pool... (None: no such frame)."""
    torch_dir = _torch_dir()
    caller = frame.f_back
    while caller is not None:
        name = caller.f_code.co_filename
        if not (name.startswith(torch_dir) or _is_stdlib(name) or name.startswith("<frozen")):
            return caller
        caller = caller.f_back
    return None


def _switches() -> tuple[dict, dict]:
    """The functions that switch the watch off: (C functions by id, code objects), each
    with its dotted name."""
    c_level, python = {}, {}
    for path in WATCH_SWITCHES:
        owner, _, attr = path.rpartition(".")
        obj = getattr(sys.modules.get(owner), attr, None)
        if obj is None or attr == "monitoring":
            continue
        if hasattr(obj, "__code__"):
            python[obj.__code__] = path
        else:
            c_level[id(obj)] = path
    monitoring = getattr(sys, "monitoring", None)  # Python 3.12+
    for attr in ("set_events", "set_local_events", "register_callback", "use_tool_id"):
        if hasattr(monitoring, attr):
            c_level[id(getattr(monitoring, attr))] = f"sys.monitoring.{attr}"
    return c_level, python


_CLONES: dict = {}  # the reference's code objects, by value: code -> (module, qualname)
_CLONES_OF: frozenset = frozenset()


def _reference_codes() -> dict:
    """Every code object of the reference modules loaded now (functions, methods, nested
    code), keyed by value: code -> (module, qualname). A code object equals its copy with
    another ``co_filename`` (``code.replace(co_filename=...)``, a copy of the package's
    files imported under another name), so a copy of the reference is known wherever it
    runs from."""
    global _CLONES, _CLONES_OF
    names = frozenset(n for n in list(sys.modules) if n.split(".")[0] == REFERENCE)
    if names == _CLONES_OF:
        return _CLONES
    import types

    codes: dict = {}
    for name in names:
        module = sys.modules.get(name)
        if module is None or _is_trusted(os.path.abspath(getattr(module, "__file__", "") or "")):
            continue
        todo = list(vars(module).values())
        while todo:
            obj = todo.pop()
            if isinstance(obj, (staticmethod, classmethod)):
                obj = obj.__func__
            elif isinstance(obj, property):
                todo += [obj.fget, obj.fset, obj.fdel]
                continue
            if isinstance(obj, type) and obj.__module__ == name:
                todo += list(vars(obj).values())
            elif isinstance(obj, types.FunctionType) and obj.__module__ == name:
                stack = [obj.__code__]
                while stack:
                    code = stack.pop()
                    codes.setdefault(code, (name, getattr(code, "co_qualname", code.co_name)))
                    stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    _CLONES, _CLONES_OF = codes, names
    return codes


@contextmanager
def watch_calls(
    answer_builtins: Sequence[str] = (), allowed: Iterable[str] = (), sent: Iterable = ()
):
    """Record, in the yielded list, the reference and answer built-ins the student calls.

    Entries are dotted names (``"attention_course.norms.LayerNorm"``,
    ``"torch.nn.functional.scaled_dot_product_attention"``), or ``WATCH_OFF`` and the
    name of what switched the watch off (``sys.setprofile``, ``threading.setprofile``...;
    seen when called, and checked again when the watch ends). Calls made by the
    checkers themselves (the reference computing the expected output) and by the
    reference inside itself are not recorded, nor calls of the building blocks in
    ``allowed`` (names, e.g. ``"MultiHeadAttention"``), nor what runs inside a method of
    an object the grader ``sent`` to the candidate (a trained model the exercise gives the
    student to take apart: its forward is reference code by design) or of its submodules.
    """
    allowed = set(allowed)
    sent_ids = {
        id(part)
        for obj in sent
        for part in (obj.modules() if callable(getattr(obj, "modules", None)) else [obj])
    }

    def inside_sent(frame) -> bool:
        """Whether ``frame`` runs, or is called from, a method of a sent object, with no
        student frame in between."""
        while frame is not None and sent_ids:
            obj = frame.f_locals.get("self")
            if id(obj) in sent_ids:
                # one of its own class's methods (not a reference function bound to it)
                method = getattr(type(obj), frame.f_code.co_name, None)
                method = method.fget if isinstance(method, property) else method
                if getattr(method, "__code__", None) is frame.f_code:
                    return True
            if not frame.f_code.co_filename.startswith((_PACKAGE_DIR, _torch_dir())) and not (
                _is_stdlib(frame.f_code.co_filename)
            ):
                return False  # reached the student's code
            frame = frame.f_back
        return False

    seen: list[str] = []
    watched_c = {}
    watched_code = {}
    for path in answer_builtins:
        obj = _resolve_object(path)
        if obj is None:
            continue
        if callable(obj) and not hasattr(obj, "__code__") and not isinstance(obj, type):
            watched_c[id(obj)] = path
        for code in _code_objects(obj):
            watched_code[code] = path
    switches_c, switches_code = _switches()
    this_file = os.path.abspath(__file__)
    clones = _reference_codes()
    torch_dir = _torch_dir()

    def switched_off(what: str) -> None:
        if WATCH_OFF + what not in seen:
            seen.append(WATCH_OFF + what)

    def profile(frame, event, arg):
        if event == "c_call":
            path = watched_c.get(id(arg))
            if path and path not in seen and _student_on_stack(frame):
                seen.append(path)
            switch = switches_c.get(id(arg))
            if switch and frame.f_code.co_filename != this_file:
                switched_off(switch)
            return
        if event != "call":
            return
        code = frame.f_code
        switch = switches_code.get(code)
        if switch is not None:
            caller = frame.f_back
            if caller is None or caller.f_code.co_filename != this_file:
                switched_off(switch)
            return
        path = watched_code.get(code)
        if path is not None:
            if path not in seen and (_student_on_stack(frame.f_back) or _student_self(frame)):
                if not inside_sent(frame.f_back):
                    seen.append(path)
            return
        name = code.co_filename
        if not (name.startswith((_PACKAGE_DIR, torch_dir)) or _is_stdlib(name)):
            # the student's code, or a copy of the reference's code made to look like it
            found = clones.get(code)
            if found is None or found[1].split(".")[0] in allowed or code.co_name[:1] == "<":
                return
            caller = _first_caller(frame)
            if caller is not None and (
                caller.f_code in clones
                or caller.f_code.co_filename.startswith(_PACKAGE_DIR)
                and caller.f_code.co_filename != _SANDBOX
            ):
                return  # a copy of the reference inside itself (or its original)
            if ".".join(found) not in seen:
                seen.append(".".join(found))
            return
        if name.startswith(_PACKAGE_DIR) and not _is_trusted(name):
            caller = _first_caller(frame)
            caller_name = caller.f_code.co_filename if caller is not None else ""
            # The reference inside itself, or the grader: not the student's call. The
            # sandbox calling the reference directly means the candidate *is* the
            # reference behind C code (functools.partial): the student's. No caller at
            # all: a thread the student started.
            if caller_name.startswith(_PACKAGE_DIR) and caller_name != _SANDBOX:
                return
            module = frame.f_globals.get("__name__", REFERENCE)
            qualname = getattr(code, "co_qualname", code.co_name)
            if qualname.split(".")[0] in allowed or code.co_name.startswith("<"):
                return
            if inside_sent(frame):
                return
            what = f"{module}.{qualname}"
            if what not in seen:
                seen.append(what)

    old = sys.getprofile()
    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        yield seen
    finally:
        # still ours? (switched off by something the profile hook could not see)
        if sys.getprofile() is not profile:
            switched_off("sys.setprofile")
        if getattr(threading, "_profile_hook", profile) is not profile:
            switched_off("threading.setprofile")
        sys.setprofile(old)
        threading.setprofile(None)


def built_on_reference(obj: object, allowed: Iterable[str] = ()) -> str:
    """``"class X inherits from attention_course.norms.LayerNorm"`` when ``obj`` (a class
    of the student's, or an instance of one) has a class of the reference package in its
    MRO, other than the building blocks in ``allowed`` (names); else ``""``."""
    cls = obj if isinstance(obj, type) else type(obj)
    if str(getattr(cls, "__module__", "")).split(".")[0] == REFERENCE:
        return ""  # the reference itself (a building block), not a class of the student's
    allowed = set(allowed)
    for base in cls.__mro__[1:]:
        module = str(getattr(base, "__module__", ""))
        if module.split(".")[0] == REFERENCE and base.__qualname__.split(".")[0] not in allowed:
            return f"class {cls.__qualname__} inherits from {module}.{base.__qualname__}"
    return ""
