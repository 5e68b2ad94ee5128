"""The report a checker returns: one line per case, a score, and a verdict.

A `Report` prints as a ✓/✗ list in a terminal (``print(report)``), renders as a
table in Jupyter (``_repr_html_``), and can be turned into plain data for a
grader (``to_dict``). Its text never contains memory addresses, timings or file
paths, so a notebook that displays it gives the same output on every machine.
"""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field

PASS_MARK = "✓"
FAIL_MARK = "✗"


@dataclass(frozen=True)
class CaseResult:
    """The outcome of one case of a checker: its name, pass/fail, what to fix, its
    weight in the score (1 for an ordinary case, less for a trivial one, 0 for a support
    case when no other case passed: see `Report.score`), and the id of the known mistake
    its message names (`_mistakes.MISTAKES`), None when it names none from that table."""

    name: str
    passed: bool
    message: str = ""
    weight: float = 1.0
    mistake: str | None = None


@dataclass
class Report:
    """What `check_<target>` returns.

    Attributes:
        target: the checker's name, e.g. ``"check_soft_argmax"``.
        results: one `CaseResult` per case, in the order they ran.
        covered: the arguments and modes of the target that the cases exercise
            (see `Case.covers`); not part of ``to_dict``.
    """

    target: str
    results: list[CaseResult] = field(default_factory=list)
    covered: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    @property
    def passed(self) -> bool:
        """True when there is at least one case and every case passed."""
        return bool(self.results) and all(r.passed for r in self.results)

    @property
    def score(self) -> float:
        """The weighted fraction of cases that passed, between 0 and 1.

        Each case counts with its ``weight``: trivial cases (H = 1, T = 1, a round
        trip) weigh less, so they cannot carry a broken implementation.

        Partial credit rewards only real work: a *support* case, one that an answer doing
        no real work passes (a constant, the input unchanged, the answer transposed, a mask
        off by one; a device, an argument check, attribute names), has its weight set to 0
        in the results by the runner (`_runner.without_unearned_support`) unless the
        candidate also passed a case that is not a support case. So such an answer scores
        exactly 0, while a solution right in the main cases and wrong in one extra feature
        keeps the weight of every case it passes. ``tests/test_partial_credit.py`` checks
        both.
        """
        total = sum(r.weight for r in self.results)
        if total <= 0:
            return 0.0
        return sum(r.weight for r in self.results if r.passed) / total

    @property
    def mistakes(self) -> list[str]:
        """The ids of the known mistakes the failing cases name, each once, in case order."""
        return list(dict.fromkeys(r.mistake for r in self.results if r.mistake))

    @property
    def num_passed(self) -> int:
        return sum(r.passed for r in self.results)

    def header(self) -> str:
        return f"{self.target}: {self.num_passed}/{len(self.results)} cases passed"

    def verdict(self) -> str:
        if self.passed:
            return "All cases pass: well done."
        return "Not passed yet: fix the first ✗ case above, then run the check again."

    def _shown(self) -> list[str]:
        """The messages as the report shows them: a long ``Hint:`` line whose first
        sentence an earlier case already showed (the float32 round-trip rule, say, which
        every float64 case repeats with its own error) is shown in full once, and later as
        that sentence and "(as above)"; ``results`` keep every message whole."""
        seen: set[str] = set()
        shown = []
        for r in self.results:
            lines = []
            for line in (r.message or "").splitlines():
                head = line.split(". ")[0].rstrip(".")
                if line.startswith("Hint: ") and len(line) > 2 * len(head) > 60:
                    if head in seen:
                        line = f"{head} (as above)."
                    seen.add(head)
                lines.append(line)
            shown.append("\n".join(lines))
        return shown

    def __str__(self) -> str:
        lines = [self.header()]
        for r, message in zip(self.results, self._shown(), strict=True):
            mark = PASS_MARK if r.passed else FAIL_MARK
            first, *rest = (message or "").splitlines() or [""]
            lines.append(f"  {mark} {r.name}" + (f": {first}" if first else ""))
            lines.extend(f"      {line}" for line in rest)
        lines.append(self.verdict())
        return "\n".join(lines)

    # Jupyter shows ``__repr__`` as the text/plain output: keep it free of addresses.
    __repr__ = __str__

    def _repr_html_(self) -> str:
        colour = "#1a7f37" if self.passed else "#cf222e"
        rows = []
        for r, message in zip(self.results, self._shown(), strict=True):
            mark = PASS_MARK if r.passed else FAIL_MARK
            mark_colour = "#1a7f37" if r.passed else "#cf222e"
            rows.append(
                "<tr>"
                f'<td style="text-align:left">{html.escape(r.name)}</td>'
                f'<td style="color:{mark_colour};text-align:center">{mark}</td>'
                '<td style="text-align:left;white-space:pre-wrap;font-family:monospace">'
                f"{html.escape(message)}</td>"
                "</tr>"
            )
        return (
            "<div>"
            f"<p><b>{html.escape(self.header())}</b></p>"
            "<table>"
            "<thead><tr><th>case</th><th>result</th><th>message</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody>"
            "</table>"
            f'<p style="color:{colour}">{html.escape(self.verdict())}</p>'
            "</div>"
        )

    def assert_passed(self) -> None:
        """Raise a one-line ``AssertionError`` unless every case passed.

        The check cells display the full report first, so the error only says
        how many cases passed; ``str(report)`` has the details.
        """
        if not self.passed:
            passed = sum(r.passed for r in self.results)
            raise AssertionError(
                f"{self.target}: {passed}/{len(self.results)} cases passed "
                f"(the report above says what to fix)"
            )

    def hint(self, tier: int = 1, case: str | None = None) -> str:
        """A hint for the first failing case (or the case named ``case``), in tiers:
        1 the concept, 2 the chapter that teaches it, 3 what to change.

        ``print(report.hint(2))`` after a check cell; "" when every case passed.
        """
        from ._hints import hint

        failing = [r for r in self.results if not r.passed and (case is None or r.name == case)]
        if not failing:
            return ""
        return hint(self.target.removeprefix("check_"), failing[0].message, tier)

    def to_dict(self) -> dict:
        """Plain, JSON-serialisable data: target, passed, score and results (each with its
        name, passed, message, weight and mistake id)."""
        return {
            "target": self.target,
            "passed": self.passed,
            "score": self.score,
            "results": [asdict(r) for r in self.results],
        }
