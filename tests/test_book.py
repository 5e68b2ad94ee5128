"""The book's structure: every chapter is in the table of contents, every
notebook records the python3 kernel, and committed notebooks carry outputs."""

import re
from pathlib import Path

import nbformat
import pytest
import yaml

from attention_course.notebooks import toc_files

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


def _chapters_in_toc_order() -> list[Path]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    files = [entry["file"] for part in toc["parts"] for entry in part["chapters"]]
    return [ROOT / f"{f}.ipynb" for f in files if (ROOT / f"{f}.ipynb").exists()]


def _first_uses() -> list[tuple[str, str, Path, int, str, bool]]:
    """Per glossary term: (English, Chinese, chapter, cell, line, Chinese in that cell?) at
    the first markdown cell, in table-of-contents order, whose prose uses the English."""
    cells = [
        (path, index, cell.source)
        for path in _chapters_in_toc_order()
        for index, cell in enumerate(nbformat.read(path, as_version=4).cells)
        if cell.cell_type == "markdown"
    ]
    prose = [(path, index, source, _prose(source)) for path, index, source in cells]
    uses = []
    for english, chinese, spellings, sense in _glossary():
        pattern = _english_pattern(spellings)
        for path, index, source, text in prose:
            hit = pattern.search(text)
            if hit and all(_has_phrase(text, phrase) for phrase in sense):
                line = text[text.rfind("\n", 0, hit.start()) + 1 :].split("\n", 1)[0]
                uses.append((english, chinese, path, index, line.strip(), chinese in source))
                break
    return uses


def test_glossary_parses():
    terms = {english: chinese for english, chinese, _, _ in _glossary()}
    assert terms["query"] == "查询" and terms["variance"] == "方差"
    assert terms["layer normalization (LayerNorm)"] == "层归一化"
    pattern = _english_pattern(["key"])
    assert pattern.search("queries, Keys and values") and not pattern.search("keyboard")
    assert _english_pattern(["query"]).search("all queries at once")


def test_first_use_of_every_glossary_term_gives_the_chinese():
    """The glossary promises: the first time a term appears, its Chinese stands beside it.
    For each term, the first chapter (in _toc.yml order) whose markdown uses the English
    must give the glossary's Chinese in the same cell, e.g. "query (查询)"."""
    missing = [
        f"{path.stem} cell {index}: {english!r} needs ({chinese}) beside it in: {line[:100]}"
        for english, chinese, path, index, line, has_chinese in _first_uses()
        if not has_chinese
    ]
    assert missing == [], "first uses without the Chinese term:\n" + "\n".join(missing)
