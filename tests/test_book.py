"""The book's structure: every chapter is in the table of contents, every
notebook records the python3 kernel, and committed notebooks carry outputs."""

import json
import re
import sys
from pathlib import Path

import nbformat
import pytest

from attention_course.grading.notebooks import toc_files

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb")) + sorted((ROOT / "exercises").rglob("*.ipynb"))


def test_every_chapter_is_in_the_table_of_contents_and_exists():
    toc = set(toc_files(ROOT))
    chapters = {f"book/{p.stem}" for p in (ROOT / "book").glob("*.ipynb")}
    pages = {f"book/{p.stem}" for p in (ROOT / "book").glob("*.md")}
    assert chapters - toc == set(), "notebooks missing from _toc.yml"
    assert pages - toc == set(), "pages missing from _toc.yml"
    missing = {e for e in toc if not any((ROOT / e).parent.glob(Path(e).name + ".*"))}
    assert missing == set(), "_toc.yml lists files that do not exist"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_notebook_metadata_and_outputs(path):
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    assert code, "a notebook without code"
    executed = [c for c in code if c.get("execution_count") is not None]
    assert len(executed) == len(code), "commit notebooks executed, with their outputs"


@pytest.mark.parametrize("path", sorted((ROOT / "book").glob("*.ipynb")), ids=lambda p: p.name)
def test_chapter_has_a_single_title(path):
    nb = nbformat.read(path, as_version=4)
    titles = [
        line
        for c in nb.cells
        if c.cell_type == "markdown"
        for line in c.source.splitlines()
        if line.startswith("# ")
    ]
    assert len(titles) == 1, f"expected one '# ' title, got {titles}"


# --- Committed outputs carry no warnings -------------------------------------------------

# A Python warning category as `warnings.formatwarning` prints it (``auto.py:21: TqdmWarning:
# ...``), or `warnings.warn`, anywhere in a stream, a displayed text or a traceback; in a
# stderr stream, also the bare word "warning" (logging's ``WARNING:``, a library's own note).
_WARNING = re.compile(r"\b[A-Z]\w*Warning\b|\bwarnings\.warn\b")


def _output_texts(output) -> list[tuple[str, str]]:
    """(where, text) for every text an output stores: a stream, a text/* item, a traceback."""
    kind = output["output_type"]
    if kind == "stream":
        return [(output["name"], output["text"])]
    if kind == "error":
        return [("traceback", "\n".join(output["traceback"]))]
    data = output.get("data", {})
    return [(mime, data[mime]) for mime in data if mime.startswith("text/")]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_markdown_has_no_control_characters(path):
    """A notebook edited by a script that wrote `"\times"` into a Python string stored a TAB
    and "imes" (chapter 23's summary rendered "T/W<TAB>imes T/W"); the same happens to
    `\frac` (form feed), `\beta` (backspace), `\right` (carriage return) and `\v...`."""
    bad = []
    for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        for line in "".join(cell["source"]).splitlines():
            found = sorted({repr(c) for c in line if ord(c) < 32 and c not in "\n"})
            if found:
                bad.append(f"cell {i}: {', '.join(found)} in {line.strip()[:70]!r}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_backtick_fence_has_a_backtick_in_its_info_string(path):
    """CommonMark: the info string of a backtick fence may not contain a backtick, so
    ```{admonition} ... `repeat` is no fence at all: the box became a paragraph and its
    closing ``` opened a code block that swallowed the next paragraph (chapter 15, found by
    a translator). A title with inline code needs a colon fence, :::{admonition}."""
    bad = []
    for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        for line in "".join(cell["source"]).splitlines():
            match = re.match(r"^\s*(`{3,})(.*)$", line)
            if match and "`" in match.group(2):
                bad.append(f"cell {i}: {line.strip()[:80]}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_outputs_carry_no_warnings(path):
    """A warning in a committed output is noise a reader cannot act on, and it differs
    between machines. Fix its cause (or silence it in the code, with a reason), then
    re-execute the notebook."""
    nb = nbformat.read(path, as_version=4)
    found = []
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            for where, text in _output_texts(output):
                text = "".join(text) if isinstance(text, list) else text
                hit = _WARNING.search(text)
                if hit is None and where == "stderr":
                    hit = re.search(r"(?i)\bwarning\b", text)
                if hit is not None:
                    line = text[text.rfind("\n", 0, hit.start()) + 1 :].split("\n", 1)[0]
                    found.append(f"cell {index} ({where}): {line.strip()[:160]}")
    assert found == [], "committed outputs hold warnings:\n" + "\n".join(found)


def _load_strip_progress():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "strip_progress", ROOT / "scripts" / "strip_progress.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_outputs_store_no_progress_bar_redraws(path):
    """Every redraw of a progress bar is stored as an output of its own, and the site
    prints each as a line. After executing a notebook, run
    ``python scripts/strip_progress.py NOTEBOOK``."""
    is_redraw = _load_strip_progress().is_progress_redraw
    nb = nbformat.read(path, as_version=4)
    found = [
        index
        for index, cell in enumerate(nb.cells)
        if any(is_redraw(output) for output in cell.get("outputs", []))
    ]
    assert found == [], f"cells {found} store progress-bar redraws: run scripts/strip_progress.py"


def test_strip_progress_removes_redraws_only():
    is_redraw = _load_strip_progress().is_progress_redraw
    bar = nbformat.v4.new_output("stream", name="stderr", text="\rtraining:  12%|█▏ | 36/300")
    assert is_redraw(bar)
    assert is_redraw(nbformat.v4.new_output("stream", name="stderr", text="\r   \r"))
    assert not is_redraw(nbformat.v4.new_output("stream", name="stdout", text="\rloss 0.1"))
    assert not is_redraw(nbformat.v4.new_output("stream", name="stderr", text="UserWarning: x\n"))


# --- Chinese beside the English at a glossary term's first use ----------------------------


def _glossary() -> list[tuple[str, str, list[str], list[str]]]:
    """(English, Chinese, English spellings, sense words) per glossary row.

    ``a / b | 甲 / 乙`` is two terms; ``layer normalization (LayerNorm)`` is one term with
    two spellings; a parenthesis with a space in it (``memory (encoder output)``) names the
    sense meant: it must occur in the same cell for a use to count ("in memory" is not
    the encoder's memory). The Chinese to find is the 中文 cell without its
    parenthesis.
    """
    rows = []
    for line in (ROOT / "book" / "glossary.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 3 or cells[0] == "English":
            continue
        if set(cells[0]) <= set("-: "):
            continue
        english, chinese = cells[0], cells[1]
        pairs = list(zip(english.split(" / "), chinese.split(" / ")))
        if len(english.split(" / ")) != len(chinese.split(" / ")):
            pairs = [(english, chinese)]
        for en, zh in pairs:
            spellings = []
            base = re.sub(r"\s*\(([^)]*)\)", "", en).strip()
            spellings.append(base)
            notes = re.findall(r"\(([^)]*)\)", en)
            spellings += [a for a in notes if " " not in a]
            sense = [a for a in notes if " " in a]
            zh = re.sub(r"\s*[(（][^)）]*[)）]", "", zh).strip()
            rows.append((en, zh, spellings, sense))
    return rows


# Terms whose plural is mostly another word: "means" is nearly always the verb.
_NO_PLURAL = {"mean"}


def _english_pattern(spellings: list[str]) -> re.Pattern:
    """Whole words, any case, the last word also in its plural (key/keys, query/queries)."""
    alternatives = []
    for s in spellings:
        words = [re.escape(w) for w in s.split()]
        last = s.split()[-1]
        if last.endswith("y") and last[-2:-1].lower() not in "aeiou":
            words[-1] = re.escape(last[:-1]) + "(?:y|ies)"
        elif last[-1:].isalpha() and last[-1:].islower() and s not in _NO_PLURAL:
            words[-1] += "(?:s|es)?"
        # Words of a term are separated by spaces, at most one line break, or a hyphen.
        alternatives.append(r"(?:[ \t]*\n?[ \t]+|\n|-)".join(words))
    return re.compile(r"(?<![\w-])(?:" + "|".join(alternatives) + r")(?![\w-])", re.IGNORECASE)


def _prose(markdown: str) -> str:
    """A markdown cell without what is not English prose: a references section, code,
    maths, link targets, HTML,
    MyST directive options and role names (``{doc}`x` `` keeps x only in its text)."""
    text = re.split(r"(?m)^#+ References\s*$", markdown)[0]  # cited titles are not our prose
    text = re.sub(r"```.*?```|~~~.*?~~~", " ", text, flags=re.DOTALL)
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.DOTALL)
    text = re.sub(r"\{[\w:-]+\}`[^`]*`", " ", text)  # roles: {doc}`...`, {cite}`...`
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\$[^$]*\$", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"<[^>]+>", " ", text)
    return re.sub(r"(?m)^:\w[\w-]*:.*$", " ", text)


def _has_phrase(text: str, phrase: str) -> bool:
    return " ".join(phrase.lower().split()) in " ".join(text.lower().split())


def _pages_in_toc_order() -> list[Path]:
    """The book's pages in reading order: the root (book/intro.md), then every chapter
    notebook and markdown page of _toc.yml, without the glossary itself."""
    pages = []
    for entry in toc_files(ROOT):
        for suffix in (".md", ".ipynb"):
            path = ROOT / f"{entry}{suffix}"
            if path.exists() and path.stem != "glossary":
                pages.append(path)
    return pages


def _markdown_cells(path: Path) -> list[tuple[int, str]]:
    """(index, source) of every markdown cell; a markdown page is one cell, index 0."""
    if path.suffix == ".md":
        return [(0, path.read_text(encoding="utf-8"))]
    cells = nbformat.read(path, as_version=4).cells
    return [(i, c.source) for i, c in enumerate(cells) if c.cell_type == "markdown"]


# Where a sentence ends: . ! ? or 。 before white space (not in e.g., i.e., et al., vs., cf.),
# a blank line, or a line that starts a list item, a table row or a heading.
_SENTENCE_END = re.compile(
    r"(?<!e\.g)(?<!i\.e)(?<! al)(?<!\bvs)(?<!\bcf)[.!?](?=\s)|。"
    r"|\n[ \t]*\n|\n(?=[ \t]*(?:[-*+]|\d+\.)[ \t])|\n(?=[ \t]*[|#])"
)


def _sentence(text: str, start: int, end: int) -> str:
    """The sentence of ``text`` that holds the span ``start:end``."""
    before = [m.end() for m in _SENTENCE_END.finditer(text, 0, start)]
    after = _SENTENCE_END.search(text, end)
    return text[(before[-1] if before else 0) : (after.start() if after else len(text))].strip()


def _first_uses() -> list[tuple[str, str, Path, int, str, bool]]:
    """Per glossary term: (English, Chinese, page, cell, sentence, Chinese in that
    sentence?) at the first markdown prose, in table-of-contents order (book/intro.md
    first), that uses the English. Headings are names, not uses: a title may say
    "Additive attention" and its first sentence give the Chinese."""
    prose = [
        (path, index, re.sub(r"(?m)^[ \t]*#+ .*$", " ", _prose(source)))
        for path in _pages_in_toc_order()
        for index, source in _markdown_cells(path)
    ]
    uses = []
    for english, chinese, spellings, sense in _glossary():
        pattern = _english_pattern(spellings)
        for path, index, text in prose:
            hit = pattern.search(text)
            if hit and all(_has_phrase(text, phrase) for phrase in sense):
                sentence = _sentence(text, hit.start(), hit.end())
                line = " ".join(sentence.split())
                uses.append((english, chinese, path, index, line, chinese in sentence))
                break
    return uses


def test_glossary_parses():
    terms = {english: chinese for english, chinese, _, _ in _glossary()}
    assert terms["query"] == "查询" and terms["variance"] == "方差"
    assert terms["layer normalization (LayerNorm)"] == "层归一化"
    pattern = _english_pattern(["key"])
    assert pattern.search("queries, Keys and values") and not pattern.search("keyboard")
    assert _english_pattern(["query"]).search("all queries at once")


def test_sentence_finds_the_sentence_around_a_use():
    text = "A mask (掩码) hides keys, e.g. padding.\nThe query\nattends here. Next one.\n\n- item"
    start = text.index("query")
    assert _sentence(text, start, start + 5) == "The query\nattends here"
    start = text.index("keys")
    assert _sentence(text, start, start + 4) == "A mask (掩码) hides keys, e.g. padding"
    assert _sentence(text, text.index("item"), len(text)) == "- item"


def test_first_use_needs_the_chinese_in_its_own_sentence(monkeypatch):
    """The Chinese in another sentence of the same cell does not count, and the intro is
    read before the chapters."""
    assert _pages_in_toc_order()[0] == ROOT / "book" / "intro.md"
    pages = {
        ROOT / "a.md": [(0, "# Attention\nAttention is everywhere. Later: attention (注意力).")],
        ROOT / "b.md": [(0, "Attention (注意力) is here.")],
    }
    monkeypatch.setattr(sys.modules[__name__], "_pages_in_toc_order", lambda: list(pages))
    monkeypatch.setattr(sys.modules[__name__], "_markdown_cells", lambda path: pages[path])
    found = {english: (path.name, ok) for english, _, path, _, _, ok in _first_uses()}
    assert found["attention"] == ("a.md", False)
    pages[ROOT / "a.md"] = [(0, "# Attention\n\nAttention (注意力) is everywhere.")]
    found = {english: (path.name, ok) for english, _, path, _, _, ok in _first_uses()}
    assert found["attention"] == ("a.md", True)


def test_first_use_of_every_glossary_term_gives_the_chinese():
    """The glossary promises: the first time a term appears, its Chinese stands beside it.
    For each term, the first page (book/intro.md, then the chapters in _toc.yml order)
    whose markdown uses the English must give the glossary's Chinese in the same
    sentence, e.g. "query (查询)"."""
    missing = [
        f"{path.stem} cell {index}: {english!r} needs ({chinese}) beside it in: {line[:120]}"
        for english, chinese, path, index, line, has_chinese in _first_uses()
        if not has_chinese
    ]
    assert missing == [], "first uses without the Chinese term:\n" + "\n".join(missing)


def _image_cells(nb) -> list[tuple[int, dict]]:
    return [
        (i, c)
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code"
        and any(k.startswith("image/") for o in c.get("outputs", []) for k in o.get("data", {}))
    ]


@pytest.mark.parametrize("path", sorted((ROOT / "book").glob("*.ipynb")), ids=lambda p: p.name)
def test_every_figure_cell_has_alt_text(path):
    """myst-nb takes a figure's alt text from ``metadata.mystnb.image.alt`` of its cell;
    without it the site's alt text is the hashed file path (``../_images/3371….png``)."""
    nb = nbformat.read(path, as_version=4)
    bad = []
    for i, cell in _image_cells(nb):
        alt = cell.metadata.get("mystnb", {}).get("image", {}).get("alt", "")
        if (
            not isinstance(alt, str)
            or len(alt.split()) < 5
            or "_images/" in alt
            or alt.strip().lower().endswith((".png", ".svg", ".jpg", ".jpeg"))
        ):
            bad.append(f"cell {i}: alt={alt!r}")
    assert bad == [], f"{path.name}: figure cells without descriptive alt text:\n" + "\n".join(bad)


# --- Notebooks find their files wherever they run from ----------------------------------

# A path relative to the working directory works from one folder only: the Chinese edition
# runs the same code cells from book/zh/, nbval runs a chapter from book/, a reader may start
# Jupyter at the repository root. Chapter 19's form works from all of them:
#     BOOK_DATA = Path(attention_course.__file__).parents[1] / "book" / "data"
# Flagged: a string argument that starts with data/, book/data/ (or ./, ../ before them),
# and asking for the working directory at all.
_CWD_RELATIVE = re.compile(
    r"""\(\s*[rRbBfFuU]{0,2}["'](?:\.{1,2}/)*(?:book/)?data/"""
    r"""|\bPath\.cwd\(|\bos\.getcwd\(|\bos\.chdir\("""
)
_EVERY_NOTEBOOK = sorted(
    p
    for folder in ("book", "exercises")
    for p in (ROOT / folder).rglob("*.ipynb")
    if not {"_build", ".ipynb_checkpoints"} & set(p.parts)
)


def _cwd_relative_lines(source: str) -> list[str]:
    return [line.strip() for line in source.splitlines() if _CWD_RELATIVE.search(line)]


def test_cwd_relative_pattern_flags_the_old_lookups_only():
    flagged = [
        'path = next(p for p in [Path("data/x.json"), Path("book/data/x.json")] if p.exists())',
        "with open('data/greedy_loops.json') as f:",
        'np.load("../data/x.npy")',
        'Path(f"book/data/{name}.json")',
        "root = next(p for p in (Path.cwd(), *Path.cwd().parents) if p.exists())",
        'os.chdir("book")',
    ]
    kept = [
        'BOOK_DATA = Path(attention_course.__file__).parents[1] / "book" / "data"',
        'study = json.loads((BOOK_DATA / "rope_scaling.json").read_text())',
        'print("results in book/data/x.json")',
        "from attention_course.data import python_docs",
        'metadata = dict(data="x")',
    ]
    assert [line for line in flagged if not _cwd_relative_lines(line)] == []
    assert [line for line in kept if _cwd_relative_lines(line)] == []


@pytest.mark.parametrize("path", _EVERY_NOTEBOOK, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_cells_do_not_read_files_relative_to_the_working_directory(path):
    nb = nbformat.read(path, as_version=4)
    found = [
        f"cell {i}: {line[:120]}"
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code"
        for line in _cwd_relative_lines(cell.source)
    ]
    assert found == [], (
        "paths relative to the working directory (use chapter 19's "
        'BOOK_DATA = Path(attention_course.__file__).parents[1] / "book" / "data"):\n'
        + "\n".join(found)
    )
