"""The built site, read as a browser with no network would read it.

Runs on ``_build/html`` as the last build left it (``.ci/run`` builds strictly just
before the tests); skipped when there is no build, unless ``ATTENTION_COURSE_REQUIRE_SITE``
is set (CI sets it, so a missing build fails there instead of passing silently).

For every page:

- no text outside code, ``pre`` and math elements holds unrendered TeX (a ``$``
  that is not a dollar amount, ``\\(``, ``\\[``, a backslash command such as
  ``\\frac``): MathJax renders only the math elements, so TeX anywhere else is
  shown raw (a ``$$`` block the Markdown parser did not recognise ends up there);
- every ``<img>`` it references is a file of the site;
- every ``<img>`` of a chapter page has alt text that describes the figure, not the
  file path myst-nb falls back to (a cell without ``metadata.mystnb.image.alt``);
- MathJax, and every other script or stylesheet, is served from the site itself:
  a page that loads it from a URL shows raw TeX offline.

The Chinese edition (``_build/html/zh``, built by ``scripts/build-book.sh`` after the
English one) is read the same way, page by page; each page of either edition links to
the same page of the other (the language switch).

Only the standard library's ``html.parser``; the whole site parses in well under a second.
"""

from __future__ import annotations

import os
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "_build" / "html"
BUILD = "jupyter-book build . -W -n --keep-going"

if not (SITE / "index.html").exists():
    if os.environ.get("ATTENTION_COURSE_REQUIRE_SITE"):
        raise RuntimeError(f"no built site at {SITE}: run `{BUILD}` first")
    pytest.skip(
        f"no built site at {SITE.relative_to(ROOT)}: build it first with `{BUILD}` "
        "(.ci/run does, before the tests)",
        allow_module_level=True,
    )

ZH = SITE / "zh"
PAGES = sorted(
    p for p in SITE.rglob("*.html") if not {"_static", "_sources"} & set(p.relative_to(SITE).parts)
)

# Elements whose text is not prose: code, program output, and scripts/styles.
_VERBATIM = {"code", "pre", "kbd", "samp", "tt", "script", "style", "textarea", "template"}
# Elements without an end tag (they never enter the stack of open elements).
_VOID = set("area base br col embed hr img input link meta source track wbr".split())

# TeX that MathJax would have rendered had it been inside a math element.
_TEX = re.compile(r"\\[()\[\]]|\\[A-Za-z]+|\$")
# A dollar amount in prose ("$5", "$1,000.50") is not TeX; "$0.1$" is, and so is "$x$".
_DOLLAR_AMOUNT = re.compile(r"\$\d[\d,]*(?:\.\d+)?(?=\s|$|[.,;:!?)](?:\s|$))")


class _Page(HTMLParser):
    """Collects a page's prose text (with the element it sits in), its images, scripts,
    stylesheets, and the TeX of its math elements."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, bool, bool]] = []  # (tag, verbatim, math)
        self.prose: list[tuple[str, str]] = []  # (innermost tag with its class, text)
        self.math: list[str] = []
        self.images: list[str] = []
        self.image_alts: list[tuple[str, str | None]] = []  # (src, alt; None if absent)
        self.scripts: list[str] = []
        self.stylesheets: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs.get("src") or "")
            self.image_alts.append((attrs.get("src") or "", attrs.get("alt")))
        elif tag == "script" and attrs.get("src"):
            self.scripts.append(attrs["src"])
        elif tag == "link" and "stylesheet" in (attrs.get("rel") or "").split():
            self.stylesheets.append(attrs.get("href") or "")
        if tag in _VOID:
            return
        classes = (attrs.get("class") or "").split()
        parent_verbatim, parent_math = self.stack[-1][1:] if self.stack else (False, False)
        label = tag + "".join("." + c for c in classes)
        self.stack.append(
            (label, parent_verbatim or tag in _VERBATIM, parent_math or "math" in classes)
        )

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in _VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag):
        # Close up to the matching open element (tolerates unclosed <p>, <li>, ...).
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0].split(".")[0] == tag:
                del self.stack[i:]
                return

    def handle_data(self, data):
        if not data.strip():
            return
        label, verbatim, math = self.stack[-1] if self.stack else ("", False, False)
        if math and not verbatim:
            self.math.append(data)
        elif not verbatim:
            self.prose.append((label, data))


_PARSED: dict[Path, _Page] = {}


def _parse(path: Path) -> _Page:
    if path not in _PARSED:
        page = _Page()
        page.feed(path.read_text(encoding="utf-8"))
        page.close()
        _PARSED[path] = page
    return _PARSED[path]


def _is_url(ref: str) -> bool:
    return bool(urlsplit(ref).scheme) or ref.startswith("//")


def _local_file(page: Path, ref: str) -> Path:
    return (page.parent / unquote(urlsplit(ref).path)).resolve()


def _ids(p: Path) -> str:
    return str(p.relative_to(SITE))


def _root(page: Path) -> Path:
    """The root of the edition a page belongs to: the site, or its zh/ folder."""
    return ZH if ZH in page.parents else SITE


def test_the_site_has_pages():
    names = {_ids(p) for p in PAGES}
    assert {"index.html", "book/01_attention_over_sets.html", "book/glossary.html"} <= names


def test_the_chinese_edition_has_every_page():
    """``scripts/build-book.sh`` builds both editions; CI requires the Chinese one."""
    if not (ZH / "index.html").exists():
        if os.environ.get("ATTENTION_COURSE_REQUIRE_SITE"):
            raise AssertionError(f"no Chinese edition at {ZH}: run scripts/build-book.sh")
        pytest.skip("the Chinese edition is not built (scripts/build-book.sh builds it)")
    english = {p.relative_to(SITE) for p in PAGES if ZH not in p.parents}
    chinese = {p.relative_to(ZH) for p in PAGES if ZH in p.parents}
    assert english == chinese


_SWITCH = re.compile(r'<p class="lang-switch">(.*?)</p>', re.S)


@pytest.mark.parametrize("path", [p for p in PAGES if p.name != "index.html"], ids=_ids)
def test_every_page_links_to_itself_in_the_other_language(path):
    """The language switch (``_templates/lang-switch.html``): English pages link to
    ``zh/<same page>``, Chinese pages back to the English one, relative, so it works
    from disk and from any static host."""
    html = path.read_text(encoding="utf-8")
    switch = _SWITCH.findall(html)
    assert len(switch) == 1, f"{_ids(path)} has {len(switch)} language switches"
    links = re.findall(r'href="([^"]+)"', switch[0])
    assert len(links) == 1, f"{_ids(path)}'s switch links to {links}"
    chinese = ZH in path.parents
    other = (SITE / path.relative_to(ZH)) if chinese else (ZH / path.relative_to(SITE))
    assert not _is_url(links[0])
    assert _local_file(path, links[0]) == other.resolve(), (
        f"{_ids(path)}'s switch points at {links[0]}, not at {other.relative_to(SITE)}"
    )
    lang = re.search(r'<html lang="([^"]+)"', html)
    assert lang and lang.group(1) == ("zh-CN" if chinese else "en"), _ids(path)
    if chinese or (ZH / "index.html").exists():
        assert other.is_file(), f"{_ids(path)}'s switch points at a missing page"


@pytest.mark.parametrize("path", PAGES, ids=_ids)
def test_no_unrendered_tex_outside_math(path):
    """Raw TeX in prose means a formula the Markdown parser did not turn into math: it is
    shown as source, online and offline. The usual cause is a ``$$`` block glued to the
    paragraph above it, or not indented with its list item; leave a blank line around it."""
    found = []
    for label, text in _parse(path).prose:
        for hit in _TEX.finditer(_DOLLAR_AMOUNT.sub(" ", text)):
            context = " ".join(text[max(0, hit.start() - 60) : hit.end() + 60].split())
            found.append(f"<{label}> {hit.group()!r} in: ...{context}...")
            break  # one report per text run is enough
    assert found == [], (
        f"unrendered TeX outside math elements in {_ids(path)} (built "
        f"{SITE.relative_to(ROOT)}; rebuild with `{BUILD}` if it is stale):\n" + "\n".join(found)
    )


@pytest.mark.parametrize("path", PAGES, ids=_ids)
def test_math_braces_balance(path):
    """An unbalanced brace makes MathJax show an error instead of the formula."""
    bad = []
    for tex in _parse(path).math:
        depth = 0
        for ch in re.sub(r"\\[{}]", "", tex):
            depth += {"{": 1, "}": -1}.get(ch, 0)
            if depth < 0:
                break
        if depth != 0:
            bad.append(" ".join(tex.split())[:120])
    assert bad == [], f"formulas with unbalanced braces in {_ids(path)}:\n" + "\n".join(bad)


@pytest.mark.parametrize("path", PAGES, ids=_ids)
def test_every_image_exists(path):
    page = _parse(path)
    missing = [
        src
        for src in page.images
        if not src.startswith("data:") and (_is_url(src) or not _local_file(path, src).is_file())
    ]
    assert missing == [], f"{_ids(path)} shows images that are not files of the site: {missing}"


@pytest.mark.parametrize("path", PAGES, ids=_ids)
def test_scripts_and_styles_are_served_from_the_site(path):
    """Offline, a script or stylesheet loaded from a URL is missing; for MathJax that
    means every formula shows as raw TeX."""
    page = _parse(path)
    remote = [ref for ref in page.scripts + page.stylesheets if _is_url(ref)]
    assert remote == [], f"{_ids(path)} loads from the network: {remote}"
    absent = [
        ref for ref in page.scripts + page.stylesheets if not _local_file(path, ref).is_file()
    ]
    assert absent == [], f"{_ids(path)} loads files the site does not have: {absent}"
    if page.math:
        mathjax = [ref for ref in page.scripts if "mathjax" in ref.lower()]
        assert mathjax, f"{_ids(path)} has formulas but loads no MathJax"
        for ref in mathjax:
            local = _local_file(path, ref)
            assert (_root(path) / "_static") in local.parents, f"MathJax from {ref}, not _static/"


def test_mathjax_fonts_are_in_static():
    """MathJax 3's CommonHTML output draws with web fonts that it loads relative to itself."""
    fonts = SITE / "_static" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2"
    assert sorted(fonts.glob("MathJax_Main-Regular.woff")), f"no MathJax fonts in {fonts}"


def _chapter_pages() -> list[Path]:
    return [p for p in PAGES if re.match(r"\d\d_", p.name) and p.parent.name == "book"]


@pytest.mark.parametrize("path", _chapter_pages(), ids=_ids)
def test_chapter_titles_carry_the_chapter_number(path):
    """The prose cites "chapter 9", "chapter 11's classifier": the sidebar and the page title
    show the same number as the file (chapter 0, the conventions, is unnumbered)."""
    number = int(path.name[:2])
    html = path.read_text(encoding="utf-8")
    shown = re.search(r'<h1><span class="section-number">(\d+)\. </span>', html)
    if number == 0:
        assert shown is None, f"{_ids(path)} is numbered {shown.group(1)}; chapter 0 is not"
    else:
        assert shown is not None, f"{_ids(path)}'s title has no chapter number"
        assert int(shown.group(1)) == number, f"{_ids(path)} is numbered {shown.group(1)}"


def _alt_is_a_path(alt: str) -> bool:
    return "_images/" in alt or alt.strip().lower().endswith((".png", ".svg", ".jpg", ".jpeg"))


def test_alt_is_a_path_recognises_the_fallback():
    assert _alt_is_a_path("../_images/3371c4a2e0b1.png")
    assert _alt_is_a_path("figure.SVG")
    assert not _alt_is_a_path("Heatmap of the 8×8 causal attention weights, zeros above.")


@pytest.mark.parametrize("path", _chapter_pages(), ids=_ids)
def test_every_figure_has_descriptive_alt_text(path):
    """Without ``metadata.mystnb.image.alt`` on its cell, myst-nb writes the hashed image
    path as the alt text, which is all a screen reader (or a reader whose image failed to
    load) gets."""
    bad = [
        f"{src}: alt={alt!r}"
        for src, alt in _parse(path).image_alts
        if alt is None or not alt.strip() or _alt_is_a_path(alt)
    ]
    assert bad == [], f"{_ids(path)} has images without descriptive alt text:\n" + "\n".join(bad)


def test_code_lines_wrap_instead_of_overflowing():
    """Every chapter loads a stylesheet that wraps long lines in code cells and outputs."""
    for path in _chapter_pages():
        css = _root(path) / "_static" / "code-wrap.css"
        assert "white-space: pre-wrap" in css.read_text(encoding="utf-8")
        refs = [_local_file(path, ref) for ref in _parse(path).stylesheets]
        assert css.resolve() in refs, f"{_ids(path)} does not load code-wrap.css"


# Pages a reader sees (the site's root index.html only redirects to book/intro.html).
_READ = [p for p in PAGES if not p.read_text(encoding="utf-8").startswith("<meta http-equiv")]


@pytest.mark.parametrize("path", _READ, ids=_ids)
def test_every_page_states_the_content_licence(path):
    """Prose and figures are CC BY-SA 4.0, code MIT (LICENSE-CONTENT.md): each page says so."""
    html = path.read_text(encoding="utf-8")
    assert 'class="content-licence"' in html and "CC BY-SA 4.0" in html, _ids(path)
