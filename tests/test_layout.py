"""The student's package is the references and the checkers; grading lives apart."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "attention_course"
GRADING_MODULES = {
    "grade",
    "sandbox",
    "cheats",
    "gradebook",
    "_kernel",
    "release",
    "notebooks",
    "isolation",
}


def test_the_grading_side_is_one_subpackage():
    found = {p.stem for p in (PACKAGE / "grading").glob("*.py")} - {"__init__"}
    assert GRADING_MODULES <= found
    for name in GRADING_MODULES | {"grading"}:  # nothing left at the top level
        assert not (PACKAGE / f"{name}.py").exists(), name


def test_no_reference_or_checker_imports_the_grading_side():
    # the command line (`cli.py`) is the one place that reaches it, for its subcommands
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "grading" or rel.name == "cli.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = "." * node.level + (node.module or "")
                names = [a.name for a in node.names]
                if "grading" in module.split(".") or "grading" in names:
                    offenders.append(f"{rel}:{node.lineno}")
            elif isinstance(node, ast.Import):
                if any("attention_course.grading" in a.name for a in node.names):
                    offenders.append(f"{rel}:{node.lineno}")
    assert offenders == []


def test_importing_the_package_and_its_checkers_loads_no_grading_module():
    code = (
        "import sys, attention_course, attention_course.checks, attention_course.quiz\n"
        "print(sorted(m for m in sys.modules if m.startswith('attention_course.grading')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
