"""The Chinese edition's machinery (issue #32): messages of Markdown text, the catalogues.

English is the source. Chinese lives in gettext catalogues, one per page or notebook:
``locales/zh_CN/LC_MESSAGES/book/01_attention_over_sets.po`` for the chapter,
``.../exercises/01_attention_over_sets.po`` for its exercise. The site's catalogues come
from Sphinx (``sphinx-build -b gettext``); a message is a block of the page's Markdown
source as written (a paragraph, a heading, a list item's paragraph, a table cell, an
admonition's title, a display formula), its newlines turned into spaces.

:func:`markdown_blocks` finds the same blocks in a notebook's Markdown cell, with the
lines each one occupies, so :func:`translate_markdown` can swap each block for its
translation and leave every other line (list markers, fences, directive options,
targets, HTML) as it is. ``tests/test_zh.py`` proves that the blocks it finds in every
chapter are exactly the messages Sphinx extracts, so the notebooks for students and the
Chinese site are translated from one catalogue. The exercises are not pages of the site:
their catalogues are written from these blocks (``scripts/zh.py extract``).

The checks that keep the translation complete and faithful (:func:`problems`) are plain
functions of a catalogue entry, so the tests and ``scripts/zh.py check`` share them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

LANGUAGE = "zh_CN"


@dataclass(frozen=True)
class Block:
    """One translatable block of a Markdown text.

    ``start``/``stop``: the lines (0-based, ``stop`` excluded) it occupies; ``prefix``:
    what comes before the text on its first line (``"- "``, ``"## "``, indentation), kept;
    ``msgid``: the message, as Sphinx writes it; ``cell``: for a table cell, its column,
    else ``None``; ``literal``: a display formula, whose lines are kept verbatim.
    """

    start: int
    stop: int
    prefix: str
    msgid: str
    cell: int | None = None
    literal: bool = False


def _parser():
    from markdown_it.renderer import RendererHTML
    from myst_parser.config.main import MdParserConfig
    from myst_parser.parsers.mdit import create_md_parser

    config = MdParserConfig(
        enable_extensions={"amsmath", "colon_fence", "deflist", "dollarmath", "substitution"}
    )
    return create_md_parser(config, RendererHTML)


_PARSER = None
_OPTION = re.compile(r"^\s*:[\w-]+:")


def _message(text: str) -> str:
    return text.replace("\n", " ").strip()


def markdown_blocks(text: str) -> list[Block]:
    """The translatable blocks of ``text`` (MyST Markdown), in order."""
    global _PARSER
    if _PARSER is None:
        _PARSER = _parser()
    lines = text.split("\n")
    return _blocks(lines, 0, len(lines))


def _blocks(lines: list[str], lo: int, hi: int) -> list[Block]:
    source = "\n".join(lines[lo:hi])
    tokens = _PARSER.parse(source)
    found: list[Block] = []
    in_table = False
    row_cells: list[str] = []
    row_map = None
    for i, tok in enumerate(tokens):
        if tok.type == "table_open":
            in_table = True
        elif tok.type == "table_close":
            in_table = False
        elif tok.type == "tr_open":
            row_cells, row_map = [], tok.map
        elif tok.type == "tr_close":
            a = lo + row_map[0]
            for col, cell in enumerate(row_cells):
                if cell.strip():
                    found.append(Block(a, a + 1, "", _message(cell), cell=col))
        elif tok.type == "inline" and in_table:
            row_cells.append(tok.content)
        elif tok.type == "inline" and tok.map and tok.content.strip():
            a, b = lo + tok.map[0], lo + tok.map[1]
            opener = tokens[i - 1] if i else None
            if opener is not None and opener.type == "heading_open":
                b = a + 1
            first = tok.content.split("\n")[0]
            where = lines[a].find(first)
            prefix = lines[a][:where] if where >= 0 else ""
            found.append(Block(a, b, prefix, _message(tok.content)))
        elif tok.type in ("math_block", "math_block_label", "amsmath") and tok.map:
            a, b = lo + tok.map[0], lo + tok.map[1]
            found.append(Block(a, b, "", tok.content, literal=True))
        elif tok.type in ("fence", "colon_fence") and tok.map and tok.info.startswith("{"):
            found.extend(_directive(lines, lo + tok.map[0], lo + tok.map[1], tok.info))
    return found


def _directive(lines: list[str], a: int, b: int, info: str) -> list[Block]:
    """A ```{name} title ... ``` directive: its title is a message, its body Markdown."""
    found = []
    title = info.split("}", 1)[1].strip() if "}" in info else ""
    if title:
        where = lines[a].find(title)
        found.append(Block(a, a + 1, lines[a][:where], title))
    body = a + 1
    stop = b - 1 if b - 1 > a and lines[b - 1].strip().startswith(("```", ":::")) else b
    while body < stop and _OPTION.match(lines[body]):
        body += 1
    found.extend(_blocks(lines, body, stop))
    return found


def _split_row(line: str) -> list[tuple[int, int]]:
    """The (start, end) columns of each cell of a table row, between unescaped pipes."""
    pipes = [m.start() for m in re.finditer(r"(?<!\\)\|", line)]
    if line.strip().startswith("|"):
        pipes = pipes
    else:
        pipes = [-1] + pipes
    if not line.rstrip().endswith("|"):
        pipes.append(len(line))
    return [(pipes[k] + 1, pipes[k + 1]) for k in range(len(pipes) - 1)]


def translate_markdown(text: str, lookup) -> str:
    """``text`` with every block replaced by ``lookup(msgid)`` (a display formula is kept).

    ``lookup`` returns the translation, or raises ``KeyError`` for a message it lacks."""
    lines = text.split("\n")
    blocks = markdown_blocks(text)
    out = list(lines)
    # Replace from the bottom up so that earlier line numbers stay valid.
    replaced: dict[int, list[str]] = {}
    for block in sorted(blocks, key=lambda bl: (bl.start, -(bl.cell or 0)), reverse=True):
        if block.literal:
            continue
        translation = lookup(block.msgid)
        if block.cell is not None:
            row = replaced.get(block.start, [out[block.start]])[0]
            span = _split_row(row)[block.cell]
            row = row[: span[0]] + " " + translation.replace("\n", " ") + " " + row[span[1] :]
            replaced[block.start] = [row]
            out[block.start] = row
            continue
        indent = " " * len(block.prefix)
        new = (block.prefix + translation).split("\n")
        new = [new[0]] + [indent + part if part else part for part in new[1:]]
        out[block.start : block.stop] = new
    return "\n".join(out)


# ---------------------------------------------------------------------------------------
# What a translation must keep: inline code, maths, roles/targets and links.

_CODE = re.compile(r"(`+)(.+?)\1", re.S)
_MATH = re.compile(r"(?<![\\$])\$(?!\$)((?:\\.|[^$\\])+?)\$|\$\$(.+?)\$\$", re.S)
_ROLE = re.compile(r"\{[\w:.-]+\}`[^`]*`")
_LINK = re.compile(r"\]\(([^)\s]+)\)|<(https?://[^>\s]+)>")
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")
_CJK = re.compile(r"[\u3400-\u9fff]")


def _roles(text: str) -> list[str]:
    """Each role as its name and target: ``{doc}`chapter 16 <16_the_modern_block>``` is
    ``{doc}16_the_modern_block``; its text (chapter 16) is prose and is translated."""
    found = []
    for role in _ROLE.findall(text):
        name, body = role.split("`", 1)
        body = body[:-1]
        target = re.search(r"<([^<>]+)>$", body)
        found.append(name + (target.group(1) if target else body))
    return sorted(found)


def _strip_markup(text: str) -> str:
    text = _ROLE.sub(" ", text)
    text = _CODE.sub(" ", text)
    text = _MATH.sub(" ", text)
    return _LINK.sub(" ", text)


def invariants(text: str) -> dict[str, list[str]]:
    """The parts of a message a translation must keep, each kind sorted (order may change
    between languages): inline code, inline maths, roles with their targets, link targets."""
    roles = _roles(text)
    rest = _ROLE.sub(" ", text)
    code = sorted(m.group(0) for m in _CODE.finditer(rest))
    rest = _CODE.sub(" ", rest)
    maths = sorted((m.group(1) or m.group(2)).strip() for m in _MATH.finditer(rest))
    links = sorted(m.group(1) or m.group(2) for m in _LINK.finditer(rest))
    return {"code": code, "maths": maths, "roles/targets": roles, "links": links}


def needs_words(msgid: str) -> bool:
    """Whether a message has English prose to translate: a display formula, a message of
    code, maths, numbers and Chinese only, has none (it is copied as it is). Sphinx turns
    the newlines of every message into spaces except a literal one's (a display formula):
    a message with a newline is a formula."""
    if "\n" in msgid:
        return False
    return bool(_WORD.search(_strip_markup(msgid)))


def has_chinese(text: str) -> bool:
    return bool(_CJK.search(text))


def english_words(text: str) -> int:
    return len(_WORD.findall(_strip_markup(text)))


# A message whose translation may be the English itself: a term in the glossary's English
# column, a name, a short label. Anything longer must be translated.
KEEP_ENGLISH_MAX_WORDS = 4


@dataclass(frozen=True)
class Term:
    english: tuple[str, ...]  # the forms that count as the term in the source
    chinese: tuple[str, ...]  # any one of them must appear in the translation


def glossary_terms(glossary: str) -> list[Term]:
    """The terminology: each row of ``book/glossary.md``'s tables, English -> Chinese.

    ``a / b`` rows give two terms; a parenthesis in the English column is an alias
    (``layer normalization (LayerNorm)``: both forms count) or a sense
    (``memory (encoder output)``, ``temperature (sampling)``): a word whose glossary entry
    names one sense of it is not checked automatically, since its other senses (a GPU's
    memory) take other words. A parenthesis in the Chinese column gives an accepted
    alternative (``归一化指数函数 (softmax)``: either)."""
    terms = []
    for line in glossary.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("English", "") or set(cells[0]) <= set("-: "):
            continue
        english, chinese = cells[0], cells[1]
        pairs = list(zip(english.split(" / "), chinese.split(" / ")))
        if len(english.split(" / ")) != len(chinese.split(" / ")):
            pairs = [(english, chinese)]
        for en, zh in pairs:
            forms = [en]
            m = re.match(r"^(.*?)\s*\((.+)\)$", en)
            if m:
                alias = m.group(2)
                if not re.fullmatch(r"[A-Z][A-Za-z0-9-]*", alias):
                    continue  # a sense, not an alias: see the docstring
                forms = [m.group(1), alias]
            zh_forms = [zh]
            m = re.match(r"^(.*?)\s*[(（](.+)[)）]$", zh)
            if m:
                zh_forms = [m.group(1).strip(), m.group(2).strip()]
            terms.append(Term(tuple(f for f in forms if f), tuple(z for z in zh_forms if z)))
    return terms


def _is_name(form: str) -> bool:
    """An acronym or a name (ReLU, FLOPs, KV cache, FlashAttention): Chinese technical
    text keeps it as it is, so the English form itself is an accepted translation."""
    return bool(re.search(r"[A-Z].*[A-Z]", form))


# Terms whose English "plural" is nearly always another word: "means" is the verb.
_NO_PLURAL = {"mean"}


def _term_pattern(form: str) -> re.Pattern:
    # Case-insensitive except a name; an English plural (keys, queries, heads) counts.
    flags = 0 if _is_name(form) else re.I
    stem = re.escape(form[:-1]) + "(?:y|ies)" if form.endswith("y") else re.escape(form)
    plural = "" if form in _NO_PLURAL else "(?:s|es)?"
    return re.compile(r"(?<![\w-])" + stem + plural + r"(?![\w-])", flags)


def terms_missing(msgid: str, msgstr: str, terms: list[Term], allowed: set[str]) -> list[str]:
    """The glossary terms the English message uses (outside code and maths) whose Chinese
    is absent from the translation. ``allowed``: terms a translator's comment exempts
    (``# terms-ok: key, mean``) where the English word is not the technical term ("the
    key idea", "this means")."""
    prose = _strip_markup(msgid)
    bad = []
    for term in terms:
        if any(form.lower() in allowed for form in term.english):
            continue
        used = [form for form in term.english if _term_pattern(form).search(prose)]
        if not used:
            continue
        accepted = list(term.chinese) + [form for form in term.english if _is_name(form)]
        if not any(zh in msgstr for zh in accepted):
            bad.append(f"{term.english[0]} -> {' or '.join(term.chinese)}")
    return bad


def problems(
    msgid: str,
    msgstr: str,
    fuzzy: bool,
    allowed_terms: set[str],
    terms,
    keep_english: bool = False,
    formula: bool = False,
) -> list[str]:
    """What is wrong with one catalogue entry (an empty list when nothing is).

    ``keep_english``: the translator's comment ``# keep-english`` says the English stays
    (a reference: authors, title, venue), so the message may be copied as it is.
    ``formula``: the message is a display formula (Sphinx extracts them too): its
    translation is the formula itself, character for character."""
    if formula:
        if msgstr and msgstr != msgid:
            return ["a display formula changed: maths is never translated, copy it as it is"]
        return []
    if fuzzy:
        return [
            "fuzzy: the English changed since it was translated; re-translate it and delete "
            "its `#, fuzzy` line"
        ]
    if not msgstr.strip():
        return ["not translated"]
    found = []
    if msgstr.strip() == msgid.strip():
        short = english_words(msgid) <= KEEP_ENGLISH_MAX_WORDS
        if needs_words(msgid) and not short and not keep_english:
            found.append("left in English (only a term or a short label may be)")
    elif needs_words(msgid) and not _CJK.search(msgstr):
        found.append("no Chinese in the translation")
    want, got = invariants(msgid), invariants(msgstr)
    for kind in want:
        if want[kind] != got[kind]:
            lost = sorted(set(want[kind]) - set(got[kind]))
            extra = sorted(set(got[kind]) - set(want[kind]))
            found.append(
                f"{kind} differ: {len(want[kind])} in English, {len(got[kind])} translated"
                + (f"; missing {lost}" if lost else "")
                + (f"; not in English {extra}" if extra else "")
            )
    if msgstr.strip() != msgid.strip():
        missing = terms_missing(msgid, msgstr, terms, allowed_terms)
        if missing:
            found.append("glossary terms without their Chinese: " + "; ".join(missing))
    return found


def keeps_english(user_comments: list[str]) -> bool:
    return any(comment.strip() == "keep-english" for comment in user_comments)


def allowed_terms(user_comments: list[str]) -> set[str]:
    allowed: set[str] = set()
    for comment in user_comments:
        if comment.strip().startswith("terms-ok:"):
            allowed |= {t.strip().lower() for t in comment.split(":", 1)[1].split(",")}
    return allowed


def read_catalogue(path: Path):
    from babel.messages.pofile import read_po

    with open(path, "rb") as f:
        return read_po(f)


def catalogue_lookup(path: Path):
    """A ``lookup(msgid)`` over one .po file's finished (non-empty, non-fuzzy) entries."""
    catalogue = read_catalogue(path)
    done = {m.id: m.string for m in catalogue if m.id and m.string and not m.fuzzy}

    def lookup(msgid: str) -> str:
        if msgid in done:
            return done[msgid]
        if not needs_words(msgid):
            return msgid
        raise KeyError(f"{path.name}: no translation of {msgid[:80]!r}")

    return lookup
