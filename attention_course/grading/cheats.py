"""The static scan of a submission's code, as the grader uses it (re-exported from
`attention_course.checks._scan`, where the check cells' policy uses it too).

The grader does not watch, inside the student's kernel, what the code calls: the
reference is absent there (`attention_course.grading.absent`: in the sandbox every
reference the exercise does not hand out is a stub that raises NotAvailableWhileGrading).
The in-kernel watch this module held (a profile hook, ``watch_calls``, and
``built_on_reference``) is deleted; what stays is the static look, ``scan_notebook``:
the AST of each task's solution cell, and of every function, class and alias of the
notebook that it uses (transitively), searched for the reference in any spelling, imports
by a computed name, ``exec``/``eval``, the PyTorch built-ins that are the answer, a class
built on the reference, and profile or trace hooks.
"""

from __future__ import annotations

from ..checks._scan import (  # noqa: F401 - the static scan, re-exported
    _OPERATOR_HOMES,
    _REACHABLE,
    DYNAMIC_CALLS,
    LOOKUP_MODULES,
    MACHINERY,
    REFERENCE,
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
