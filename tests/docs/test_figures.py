"""Every figure of the READMEs and docs/ is tied to its record and says what the record says.

The mechanism (references, regions, the allow-list) is described in ``docs_figures.py`` beside
this file and, for contributors, in docs/evaluation.md "Figures in the docs".
"""

from __future__ import annotations

from pathlib import Path

import pytest
from docs_figures import ROOT, Figure, check, doc_files, evaluate, figures, matches

DOCS = doc_files()


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_every_figure_is_tied_to_its_record(path: Path) -> None:
    report = check(path)
    assert not report.problems, "\n".join(report.problems)


def test_the_counts_are_printed(capsys: pytest.CaptureFixture[str]) -> None:
    reports = [check(path) for path in DOCS]
    ties = ("reference", "generated", "region", "unrecorded", "not-a-result")
    totals = {tie: sum(r.count(tie) for r in reports) for tie in ties}
    with capsys.disabled():
        print(f"\nfigures in {len(DOCS)} files: " + ", ".join(f"{n} {tie}" for tie, n in totals.items()))
    assert totals["reference"] >= 20 and totals["generated"] >= 20


def _readme_with(old: str, new: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert old in text
    return text.replace(old, new, 1)


def test_the_issue_edit_fails() -> None:
    """README "3.82 and 3.93 GiB" -> "1.82 and 1.93 GiB" (the references stay): both figures differ
    from their records."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    edited = text.replace("3.82<!--", "1.82<!--", 1).replace("3.93 GiB<!--", "1.93 GiB<!--", 1)
    assert edited != text and check(ROOT / "README.md", text).problems == []
    problems = check(ROOT / "README.md", edited).problems
    assert len(problems) == 2, problems
    assert "the text says 1.82, its record says 3.82" in problems[0]
    assert "the text says 1.93, its record says 3.93" in problems[1]


def test_a_figure_without_a_reference_fails() -> None:
    """The same edit with the references removed: two figures tied to nothing."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("3.82<!--")
    end = text.index("-->", text.index("3.93 GiB<!--", start)) + len("-->")
    edited = text[:start] + "1.82 and 1.93 GiB" + text[end:]
    problems = check(ROOT / "README.md", edited).problems
    assert [p.split(": ", 1)[1] for p in problems] == [
        "1.82 is tied to no record (see tests/docs/docs_figures.py)",
        "1.93 is tied to no record (see tests/docs/docs_figures.py)",
    ]


def test_a_changed_figure_in_a_region_or_a_generated_block_fails_or_is_left_to_its_test(tmp_path: Path) -> None:
    record = tmp_path / "r.json"
    record.write_text('{"rows": [{"peak_gb": 3.8213, "s": 31.04}], "name": "x"}', encoding="utf-8")
    page = tmp_path / "page.md"
    good = (
        "Intro 4.1 GB<!--not-a-result: an example-->.\n\n"
        "<!-- figures-from: r.json -->\n\n| peak | s |\n|---|---|\n| 3.82 GB | 31.0 |\n\n<!-- /figures-from -->\n\n"
        "<!-- record: r.json -->\nIt peaked at 3.8 GB<!--= #/rows/0/peak_gb -->, 0.123x<!--= #/rows/0/peak_gb / #/rows/0/s -->.\n"
        "<!-- unrecorded: printed once -->\n7.5 s\n<!-- /unrecorded -->\n"
        "```\n9.99 in a code block\n```\nand `1.25` in inline code, Python 3.11, ≤ 0.10.\n"
    )
    report = check(page, good, root=tmp_path)
    assert report.problems == []
    assert [f.tie for f in report.figures] == [
        "not-a-result",
        "region",
        "region",
        "reference",
        "reference",
        "unrecorded",
        "not-a-result",
        "not-a-result",
    ]
    bad = good.replace("| 3.82 GB |", "| 3.72 GB |").replace("0.123x", "0.133x").replace("printed once", "")
    problems = check(page, bad, root=tmp_path).problems
    assert any("3.72 is in none of r.json" in p for p in problems)
    assert any("the text says 0.133x" in p for p in problems)
    assert any("unrecorded: --> needs a reason" in p for p in problems)
    broken = good.replace("#/rows/0/peak_gb -->", "#/rows/1/peak_gb -->", 1)
    assert any(
        "bad reference" in p and "no '/rows/1/peak_gb'" in p for p in check(page, broken, root=tmp_path).problems
    )


def test_precision_and_expressions(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{"x": 3.8151, "y": [2, 4], "step 10": {"v": 0.5}}', encoding="utf-8")
    found, _, _ = figures(tmp_path / "p.md", "3.82, 3.8, 4 and 1,186 and 53 % and 0.85x")
    assert [(f.text, f.value, f.decimals) for f in found] == [
        ("3.82", 3.82, 2),
        ("3.8", 3.8, 1),
        ("1,186", 1186.0, 0),
        ("53 %", 53.0, 0),
        ("0.85x", 0.85, 2),
    ]
    figure = Figure(tmp_path, 1, "3.82", 3.82, 2, False, 0)
    assert matches(figure, 3.8151) and not matches(figure, 3.825_1) and not matches(figure, 3.83)
    assert evaluate("a.json#/y/1 / a.json#/y/0 - 1", None, tmp_path)[0] == 1.0
    assert evaluate("#/step%2010/v * 100", "a.json", tmp_path)[0] == 50.0
    with pytest.raises(ValueError, match="unknown name"):
        evaluate("__import__('os')", None, tmp_path)
    with pytest.raises(LookupError, match="not a number"):
        evaluate("a.json#/y", None, tmp_path)


def test_a_whole_number_can_be_tied(tmp_path: Path) -> None:
    """A whole number is not a figure by itself, but a reference after it ties and checks it."""
    (tmp_path / "r.json").write_text('{"n": 562}', encoding="utf-8")
    page = tmp_path / "p.md"
    good = "at most 562<!--= r.json#/n --> were never rated\n"
    report = check(page, good, root=tmp_path)
    assert report.problems == [] and [(f.text, f.tie) for f in report.figures] == [("562", "reference")]
    assert (
        "the text says 561, its record says 562" in check(page, good.replace("562", "561"), root=tmp_path).problems[0]
    )
