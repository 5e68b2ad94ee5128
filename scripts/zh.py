"""The Chinese edition (issue #32): catalogues, status, checks, the site and the notebooks.

English is the source; Chinese lives in one gettext catalogue per page or notebook under
``locales/zh_CN/LC_MESSAGES/`` (``book/NN_name.po`` for a chapter, ``exercises/NN_name.po``
for its exercise). Run from the repository root with the venv's Python:

    python scripts/zh.py update          # extract the English messages, merge them into the
                                         # catalogues (new: empty; changed: fuzzy)
    python scripts/zh.py status          # per catalogue: messages, translated, fuzzy, missing
    python scripts/zh.py check [PO...]   # every problem, as FILE:LINE: what is wrong
    python scripts/zh.py build           # the Chinese site, strictly, into _build/html/zh
    python scripts/zh.py notebooks [PO...]  # exercises/zh/, book/zh/ from finished catalogues

``scripts/build-book.sh`` builds both sites. A translator's recipe is in
``locales/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _i18n  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOCALES = ROOT / "locales"
CATALOGUES = LOCALES / _i18n.LANGUAGE / "LC_MESSAGES"
POT = ROOT / "_build" / "gettext"
CONF = ROOT / "_build" / ".sphinx-conf"
SITE = ROOT / "_build" / "html" / "zh"
BIN = Path(sys.executable).parent

# What the Chinese site says in place of the English configuration's own strings (the
# theme's strings, "Search", "Contents"…, come translated with Sphinx and the theme).
ZH_CONF = {
    "html_title": "注意力机制：从对齐到 Transformer",
    "html_theme_options.search_bar_text": "搜索本书……",
    "html_theme_options.extra_footer": (
        '<p class="content-licence">文字与插图：'
        '<a href="https://creativecommons.org/licenses/by-sa/4.0/">CC BY-SA 4.0</a>；'
        "代码：MIT。见仓库中的 LICENSE-CONTENT.md 与 LICENSE。</p>\n"
    ),
}


def _run(cmd: list[str], **kw) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run(["nice", *[str(c) for c in cmd]], cwd=ROOT, check=True, **kw)


# The parts' captions of the table of contents: sphinx-external-toc adds the toctrees to the
# root page after Sphinx's translation step, so their captions, which the gettext builder
# does extract (into the root page's catalogue), would stay English in the sidebar.
CAPTIONS = """
def _translate_captions(app, doctree):
    from babel.messages.pofile import read_po
    from sphinx import addnodes

    po = _os.path.join(_ROOT, "locales", language, "LC_MESSAGES", app.env.docname + ".po")
    if not _os.path.exists(po):
        return
    with open(po, "rb") as f:
        done = {m.id: m.string for m in read_po(f) if m.id and m.string and not m.fuzzy}
    for node in doctree.findall(addnodes.toctree):
        if node.get("caption") in done:
            node["caption"] = done[node["caption"]]


def setup(app):
    app.connect("doctree-read", _translate_captions)
"""


# Sphinx 7.4's Chinese search keeps every Latin word it meets in one list, a class
# attribute shared by the whole build, and tests each word's membership in it: quadratic,
# 70 % of the Chinese build's time. The same membership, kept in a set beside the list:
# the same search index byte for byte, and the build went from 94 s to 23 s (2-core
# machine, load 3-4).
SEARCH = """
import sphinx.search as _search
from sphinx.search.zh import SearchChinese as _SearchChinese


class _LatinTerms(list):
    def __init__(self):
        super().__init__()
        self._seen = set()

    def extend(self, terms):
        terms = list(terms)
        super().extend(terms)
        self._seen.update(terms)

    def __contains__(self, term):
        return term in self._seen


class _FastSearchChinese(_SearchChinese):
    def init(self, options):
        super().init(options)
        self.latin_terms = _LatinTerms()


_search.languages["zh"] = _FastSearchChinese
"""


def sphinx_conf(chinese: bool = False) -> Path:
    """The Sphinx configuration Jupyter Book builds with (``jupyter-book config sphinx``),
    written to ``_build/.sphinx-conf[-zh]/conf.py`` with its paths made absolute, so that
    ``sphinx-build -c`` can run the gettext and the Chinese builds; ``chinese``: with
    ``language = "zh_CN"`` and the Chinese title, search placeholder and footer."""
    generated = ROOT / "conf.py"
    if generated.exists():
        raise SystemExit(f"{generated} exists; this script writes and removes its own")
    try:
        subprocess.run(
            [BIN / "jupyter-book", "config", "sphinx", "."],
            cwd=ROOT,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        text = generated.read_text(encoding="utf-8")
    finally:
        generated.unlink(missing_ok=True)
    conf = CONF.with_name(CONF.name + "-zh") if chinese else CONF
    conf.mkdir(parents=True, exist_ok=True)
    text += (
        "\n# scripts/zh.py: paths from the repository root, since conf.py lives elsewhere\n"
        f"_ROOT = {str(ROOT)!r}\n"
        "import os as _os\n"
        "html_static_path = [_os.path.join(_ROOT, p) for p in html_static_path]\n"
        "templates_path = [_os.path.join(_ROOT, p) for p in templates_path]\n"
        "locale_dirs = [_os.path.join(_ROOT, p) for p in locale_dirs]\n"
        "external_toc_path = _os.path.join(_ROOT, external_toc_path)\n"
    )
    if chinese:
        glossary = (ROOT / "book" / "glossary.md").read_text(encoding="utf-8")
        words = sorted({zh for term in _i18n.glossary_terms(glossary) for zh in term.chinese})
        words = [w for w in words if _i18n.has_chinese(w) and " " not in w]
        text += (
            f"language = {_i18n.LANGUAGE!r}\n"
            "# Sphinx's Chinese search index segments words with jieba (without it, the index\n"
            "# holds no Chinese word at all): required here, so a missing one fails the build.\n"
            "import logging as _logging, jieba as _jieba\n"
            "_jieba.setLogLevel(_logging.WARNING)\n"
            "# The glossary's terms are words of their own (自注意力, not 自 + 注意力), so a\n"
            "# search for a term finds it.\n"
            f"for _word in {words!r}:\n"
            "    _jieba.add_word(_word)\n"
            + CAPTIONS
            + SEARCH
            + f"html_title = {ZH_CONF['html_title']!r}\n"
            "html_theme_options = dict(html_theme_options,\n"
            f"    search_bar_text={ZH_CONF['html_theme_options.search_bar_text']!r},\n"
            f"    extra_footer={ZH_CONF['html_theme_options.extra_footer']!r})\n"
        )
    (conf / "conf.py").write_text(text, encoding="utf-8")
    return conf


# ---------------------------------------------------------------------------------------
# Extraction


def exercise_sources() -> list[Path]:
    return sorted((ROOT / "exercises").glob("[0-9][0-9]_*.ipynb"))


def notebook_messages(path: Path) -> list[tuple[str, int, bool]]:
    """(msgid, location, formula) of every block of a notebook's Markdown cells; the
    location is myst-nb's, as in the site's catalogues ((cell index + 1) × 10000 + line
    + 1, the line counted from 1; :func:`where` reads it back); ``formula``: a display
    formula."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    found = []
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        for block in _i18n.markdown_blocks("".join(cell["source"])):
            location = (index + 1) * 10000 + block.start + 2
            found.append((block.msgid, location, block.literal))
    return found


def write_exercise_templates() -> None:
    """The exercises are not pages of the site: their templates come from the same blocks
    (``tests/test_zh.py`` proves the blocks are Sphinx's messages on every chapter)."""
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import write_po

    out = POT / "exercises"
    out.mkdir(parents=True, exist_ok=True)
    for path in exercise_sources():
        catalog = Catalog(project="attention_course", charset="utf-8")
        for msgid, line, _ in notebook_messages(path):
            catalog.add(msgid, locations=[(f"../../exercises/{path.name}", line)])
        with open(out / f"{path.stem}.pot", "wb") as f:
            write_po(f, catalog, width=76, omit_header=False)


def extract() -> None:
    conf = sphinx_conf()
    shutil.rmtree(POT, ignore_errors=True)
    _run(
        [BIN / "sphinx-build", "-q", "-b", "gettext", "-c", conf, "-d",
         ROOT / "_build" / ".doctrees-gettext", ".", POT]
    )  # fmt: skip
    # The gettext builder also writes the strings of our own HTML templates (_templates/)
    # to sphinx.pot; the theme's strings are kept by hand in sphinx.po, which Sphinx
    # merges with its own and the theme's catalogues: merging it with that partial
    # template would make every other string of it obsolete.
    (POT / "sphinx.pot").unlink(missing_ok=True)
    write_exercise_templates()
    print(f"templates in {POT.relative_to(ROOT)}: {len(list(POT.rglob('*.pot')))} files")


def update() -> None:
    """Extract, merge into the catalogues with sphinx-intl, then fill the messages that
    have nothing to translate (a display formula, code only) with the English."""
    extract()
    _run([BIN / "sphinx-intl", "update", "-p", POT, "-l", _i18n.LANGUAGE, "-d", LOCALES, "-w",
          "76"])  # fmt: skip
    from babel.messages.pofile import write_po

    for po in sorted(CATALOGUES.rglob("*.po")):
        if po.name == "sphinx.po":  # the theme's strings: written by hand, no template
            continue
        catalogue = _i18n.read_catalogue(po)
        maths = formulas(po)
        changed = False
        for message in catalogue:
            if not message.id or message.string:
                continue
            if message.id in maths or not _i18n.needs_words(message.id):
                message.string = message.id
                changed = True
        if changed:
            with open(po, "wb") as f:
                write_po(f, catalogue, width=76)


# ---------------------------------------------------------------------------------------
# Status and checks


def catalogues(paths: list[str] | None = None) -> list[Path]:
    if paths:
        return [Path(p).resolve() for p in paths]
    return sorted(CATALOGUES.rglob("*.po"))


def _name(po: Path) -> str:
    return str(po.relative_to(CATALOGUES).with_suffix(""))


def status(paths: list[str] | None = None) -> None:
    rows = []
    for po in catalogues(paths):
        messages = [m for m in _i18n.read_catalogue(po) if m.id]
        maths = formulas(po)
        fuzzy = sum(1 for m in messages if m.fuzzy)
        done = sum(1 for m in messages if m.string and not m.fuzzy)
        words = sum(
            _i18n.english_words(m.id)
            for m in messages
            if m.id not in maths and _i18n.needs_words(m.id)
        )
        rows.append((_name(po), len(messages), done, fuzzy, len(messages) - done - fuzzy, words))
    width = max(len(r[0]) for r in rows)
    header = ("catalogue", "messages", "translated", "fuzzy", "missing", "en words")
    print(f"{header[0]:<{width}}  " + "  ".join(f"{h:>10}" for h in header[1:]))
    for row in rows:
        print(f"{row[0]:<{width}}  " + "  ".join(f"{v:>10}" for v in row[1:]))
    total = [sum(r[i] for r in rows) for i in range(1, 6)]
    print(f"{'total':<{width}}  " + "  ".join(f"{v:>10}" for v in total))


def source_blocks(source: Path) -> list[tuple[str, str, bool]]:
    """(msgid, where, formula) of every block of a page or notebook, ``where`` naming the
    cell and line as a reader finds them, ``formula`` true for a display formula."""
    if source.suffix == ".md":
        text = source.read_text(encoding="utf-8")
        return [(b.msgid, f"line {b.start + 1}", b.literal) for b in _i18n.markdown_blocks(text)]
    return [
        (msgid, where(source.name, location), literal)
        for msgid, location, literal in notebook_messages(source)
    ]


def where(filename: str, location: int | None) -> str:
    """A catalogue location as a reader finds it: in a notebook, the cell (counted from 1,
    as Jupyter's "Go to cell" does) and the line within it; in a page, the line."""
    location = int(location or 0)
    if filename.endswith(".ipynb"):
        return f"cell {location // 10000}, line {location % 10000 - 1}"
    return f"line {location}"


def formulas(po: Path) -> set[str]:
    """The display formulas among a catalogue's messages, as its English source has them."""
    source = source_of(po)
    if not source.exists():
        return set()
    return {msgid for msgid, _, formula in source_blocks(source) if formula}


def toc_captions() -> set[str]:
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    return {part["caption"] for part in toc.get("parts", []) if "caption" in part}


def source_of(po: Path) -> Path:
    """The English page or notebook a catalogue translates."""
    name = po.relative_to(CATALOGUES).with_suffix(".ipynb")
    path = ROOT / name
    return path if path.exists() else path.with_suffix(".md")


def coverage(po: Path) -> list[str]:
    """Blocks of the English source that the catalogue lacks (the English changed and
    ``update`` was not run, or it was and this paragraph is new), and messages of the
    catalogue that the source no longer has. Sphinx itself shows the English of a message
    it cannot find, silently: this is what makes an untranslated change fail."""
    source = source_of(po)
    if not source.exists():
        return [f"{_name(po)}.po: no English source {source.relative_to(ROOT)}"]
    catalogue = {m.id for m in _i18n.read_catalogue(po) if m.id}
    blocks = source_blocks(source)
    found = [
        f"{source.relative_to(ROOT)} ({where}): {msgid[:70]!r} is not in {_name(po)}.po "
        "(run `python scripts/zh.py update`, then translate it)"
        for msgid, where, _ in blocks
        if msgid not in catalogue
    ]
    extra = catalogue - {msgid for msgid, _, _ in blocks}
    if source.stem == "intro":
        extra -= toc_captions()
    found += [
        f"{_name(po)}.po: {msgid[:70]!r} is no longer in {source.relative_to(ROOT)} "
        "(run `python scripts/zh.py update`)"
        for msgid in sorted(extra)
    ]
    return found


def check(paths: list[str] | None = None) -> list[str]:
    """Every problem of every catalogue, as ``FILE:LINE: message: problem``."""
    terms = _i18n.glossary_terms((ROOT / "book" / "glossary.md").read_text(encoding="utf-8"))
    found = []
    for po in catalogues(paths):
        maths = formulas(po)
        source = source_of(po)
        # Sphinx gives a table cell no line; the source's blocks have one.
        places = {}
        if source.exists():
            for msgid, place, _ in source_blocks(source):
                places.setdefault(msgid, place)
        for message in _i18n.read_catalogue(po):
            if not message.id:
                continue
            allowed = _i18n.allowed_terms(message.user_comments)
            for problem in _i18n.problems(
                message.id,
                message.string or "",
                message.fuzzy,
                allowed,
                terms,
                _i18n.keeps_english(message.user_comments),
                formula=message.id in maths,
            ):
                file, location = message.locations[0] if message.locations else ("?", 0)
                file = file.replace("../../", "").replace(str(ROOT) + "/", "")
                place = places.get(message.id) or where(file, location)
                found.append(f"{_name(po)}.po ({file}, {place}): {message.id[:70]!r}: {problem}")
    return found


# ---------------------------------------------------------------------------------------
# The Chinese site


def build() -> float:
    conf = sphinx_conf(chinese=True)
    start = time.perf_counter()
    shutil.rmtree(SITE, ignore_errors=True)
    _run(
        [BIN / "sphinx-build", "-q", "-W", "-n", "--keep-going", "-b", "html",
         "-c", conf,
         "-d", ROOT / "_build" / ".doctrees-zh", ".", SITE]
    )  # fmt: skip
    seconds = time.perf_counter() - start
    print(f"The Chinese site is in {SITE.relative_to(ROOT)}/index.html ({seconds:.0f} s)")
    return seconds


# ---------------------------------------------------------------------------------------
# Notebooks


def translated_notebook(source: Path, po: Path) -> dict:
    """``source`` with each Markdown cell translated block by block from ``po``; every
    other cell, every output and all metadata exactly as in English."""
    nb = json.loads(source.read_text(encoding="utf-8"))
    lookup = _i18n.catalogue_lookup(po)
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            text = _i18n.translate_markdown("".join(cell["source"]), lookup)
            cell["source"] = text.splitlines(keepends=True)
    return nb


def target_of(po: Path) -> Path:
    name = po.relative_to(CATALOGUES).with_suffix(".ipynb")
    return ROOT / name.parts[0] / "zh" / Path(*name.parts[1:])


def write_notebook(nb: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # The layout nbformat writes (one-space indent, keys sorted), as the English ones.
    text = json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    path.write_text(text, encoding="utf-8")


def notebooks(paths: list[str] | None = None) -> list[Path]:
    """Write the Chinese notebook of each finished catalogue (or of each one named: then
    an unfinished one is an error). A catalogue of a page that is not a notebook is
    skipped."""
    written = []
    for po in catalogues(paths):
        source = source_of(po)
        if source.suffix != ".ipynb":
            continue
        problems = coverage(po) + check([str(po)])
        if problems:
            if paths:
                raise SystemExit("\n".join(problems[:20]) + f"\n{po}: not finished")
            continue
        target = target_of(po)
        write_notebook(translated_notebook(source, po), target)
        written.append(target)
        print(f"wrote {target.relative_to(ROOT)}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("extract", help="write the English templates (.pot) to _build/gettext")
    sub.add_parser("update", help="extract and merge into locales/zh_CN/LC_MESSAGES")
    for name in ("status", "check", "notebooks"):
        sub.add_parser(name).add_argument("po", nargs="*")
    sub.add_parser("build", help="build the Chinese site into _build/html/zh")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.command == "extract":
        extract()
    elif args.command == "update":
        update()
    elif args.command == "status":
        status(args.po)
    elif args.command == "check":
        found = [p for po in catalogues(args.po) if po.name != "sphinx.po" for p in coverage(po)]
        found += check(args.po)
        print("\n".join(found) if found else "every message translated and consistent")
        return 1 if found else 0
    elif args.command == "build":
        build()
    elif args.command == "notebooks":
        notebooks(args.po)
    return 0


if __name__ == "__main__":
    sys.exit(main())
