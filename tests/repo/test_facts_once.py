"""Each fact once (CONTRIBUTING.md, "Docs"): the studies' results live in docs/results.md, the turn
loop's overhead in docs/performance.md. The README states a few results in one paragraph, and
they must be docs/results.md's numbers, written as it writes them; the other pages link instead
of restating them. Nothing in the repository cites a file outside it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
RESULTS = ROOT / "docs" / "results.md"
# the pages that link to docs/results.md instead of restating it: every doc but the results, and CONTRIBUTING
LINKING = [ROOT / "CONTRIBUTING.md", *(p for p in sorted((ROOT / "docs").glob("*.md")) if p != RESULTS)]

# a decimal with its sign (−, - or +) if it has one, and its "± half-width" if it has one
NUMBER = re.compile(r"(?<![\w.])([+−-]?)(\d+\.\d+)(?:\s*±\s*(\d+\.\d+))?(?![\d.]*\d)")


def section(text: str, heading: str) -> str:
    """The text under the ``## heading`` whose title starts with ``heading``, up to the next ``## ``."""
    match = re.search(rf"^## {re.escape(heading)}.*?$(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"no '## {heading}' section"
    return match.group(1)


def numbers(text: str) -> list[tuple[str, str, str | None]]:
    """``(sign, value, half-width or None)`` of every decimal in ``text``, signs spelled ``−`` or ``+``."""
    return [(sign.replace("-", "−"), value, ci or None) for sign, value, ci in NUMBER.findall(text)]


def written(sign: str, value: str, ci: str | None) -> str:
    return f"{sign}{value}" + (f" ± {ci}" if ci else "")


def study_sections(results: str) -> dict[str, str]:
    """``{study number: its text}``: a ``## Study N`` section, or the section that introduces ``**Study N**``."""
    parts = re.split(r"^(?=## )", results, flags=re.MULTILINE)
    studies: dict[str, str] = {}
    for part in parts:
        for n in re.findall(r"^## Study (\d+)", part, re.MULTILINE) + re.findall(r"\*\*Study (\d+)\*\*", part):
            studies.setdefault(n, part)
    return studies


def readme_result_claims() -> list[tuple[str, tuple[str, str, str | None]]]:
    """``(study, number)`` for each decimal of the README's Results paragraph, the study being the last
    ``study N`` the paragraph named before it."""
    text = section(README.read_text(), "Results")
    claims, study = [], None
    for piece in re.split(r"(\bstudy \d+)", text):
        if m := re.fullmatch(r"study (\d+)", piece):
            study = m.group(1)
            continue
        for number in numbers(piece):
            assert study is not None, f"README Results: {written(*number)} comes before any 'study N' names its source"
            claims.append((study, number))
    return claims


def stated(number: tuple[str, str, str | None], text: str) -> bool:
    """Whether ``text`` states ``number``: the same digits, the same sign (none counts as +), the same ± part."""
    sign, value, ci = number
    return any(
        value == v and (ci is None or ci == c) and sign.replace("+", "") == s.replace("+", "")
        for s, v, c in numbers(text)
    )


def test_the_readmes_result_sentences_are_docs_results_numbers():
    claims = readme_result_claims()
    studies = study_sections(RESULTS.read_text())
    assert len(claims) >= 10 and {"4", "5"} <= {study for study, _ in claims}, claims
    wrong = [
        f"study {study}: {written(*number)}"
        for study, number in claims
        if study not in studies or not stated(number, studies[study])
    ]
    assert not wrong, (
        f"the README's Results paragraph states numbers that docs/results.md's study sections do not: {wrong} "
        "(write each as docs/results.md writes it, digits, sign and ± included)"
    )
    assert "](docs/results.md)" in section(README.read_text(), "Results"), "the paragraph links docs/results.md"


def test_the_readmes_demo_sentences_are_its_tables():
    """The sentences under the demo's table quote its held-out (countdown) pass@k: each three-decimal
    number is a cell of the column of the last ``pass@k`` named before it, so a regenerated table
    updates them too."""
    demo = section(README.read_text(), "The demo")
    lines = [line.strip("| ").split(" | ") for line in demo.splitlines() if line.startswith("| ")]
    header, rows = lines[0], [row for row in lines[2:] if row[0] == "countdown_val"]
    column = {name: {row[i] for row in rows} for i, name in enumerate(header)}
    assert len(rows) == 3 and {"pass@1", "pass@16"} <= column.keys(), header
    prose = re.sub(r"^\|.*$", "", demo, flags=re.MULTILINE)
    quoted, wrong, name = 0, [], None
    for piece in re.split(r"(pass@\d+)", prose):
        if re.fullmatch(r"pass@\d+", piece):
            name = piece
            continue
        for _, value, _ in numbers(piece):
            if re.fullmatch(r"0\.\d{3}", value):
                quoted += 1
                if value not in column.get(name, ()):
                    wrong.append(f"{name} {value}")
    assert quoted >= 4 and not wrong, f"not in the README's countdown_val rows of the demo table: {wrong}"


def test_no_other_page_restates_the_results():
    """CONTRIBUTING.md and docs/*.md link to docs/results.md: none repeats a ``mean ± CI`` of it or a
    number of the README's Results paragraph."""
    results = RESULTS.read_text()
    intervals = {written("", value, ci) for _, value, ci in numbers(results) if ci}
    headline = {written("", value, ci) for _, (_, value, ci) in readme_result_claims()}
    assert len(intervals) > 50 and len(headline) >= 10
    restated = {}
    for path in LINKING:
        found = {written("", value, ci) for _, value, ci in numbers(path.read_text())}
        found |= {written("", value, None) for _, value, _ in numbers(path.read_text())}
        if hits := sorted(found & (intervals | headline)):
            restated[path.name] = hits
    assert not restated, f"restated from docs/results.md (link to it instead): {restated}"
    for name in ("agents.md", "demo.md"):
        assert "](results.md" in (ROOT / "docs" / name).read_text(), f"docs/{name} links docs/results.md"


def turn_loop_ratios() -> dict[str, str]:
    """``{turns: "1.19×"}`` for 3 and 5 turns, from the benchmark's own report."""
    report = (ROOT / "benchmarks" / "results" / "agents.md").read_text()
    rows = {row[0]: row for row in (line.strip("| ").split(" | ") for line in report.splitlines()) if len(row) > 6}
    return {turns: rows[turns][5].replace("x", "×") for turns in ("3", "5")}


def test_the_turn_loops_overhead_lives_in_one_place():
    """benchmarks/results/agents.md's ratios appear in docs/performance.md and on no other page."""
    ratios = turn_loop_ratios()
    assert all(re.fullmatch(r"\d\.\d\d×", r) for r in ratios.values()), ratios
    performance = (ROOT / "docs" / "performance.md").read_text()
    row = next(line for line in performance.splitlines() if "benchmarks/agents.py" in line)
    assert f"{ratios['3']} at 3 turns" in row and f"{ratios['5']} at 5 turns" in row, (ratios, row)
    elsewhere = {
        path.name: sorted(r for r in ratios.values() if r in path.read_text())
        for path in [README, *LINKING]
        if path.name != "performance.md"
    }
    assert not any(elsewhere.values()), f"the turn loop's overhead restated (link docs/performance.md): {elsewhere}"


def test_inline_script_commands_name_scripts_of_the_repository():
    """``bash X`` quoted in the text (CONTRIBUTING.md's ``bash .ci/run``) runs a script that exists."""
    seen = []
    for path in [README, *LINKING]:
        for script in re.findall(r"`bash ([\w./-]+)[^`]*`", path.read_text()):
            seen.append(script)
            assert (ROOT / script).is_file(), (path.name, script)
    assert ".ci/run" in seen


def test_nothing_in_the_repository_cites_a_style_guide_outside_it():
    """The style guide is CONTRIBUTING.md's "How we write code"; no file cites one that is not here."""
    outside = "STYLE" + ".md"
    sources = [README, ROOT / "Makefile", ROOT / "pyproject.toml", *LINKING]
    for folder in ("lit_rlvr", "tests", "benchmarks", "configs", "examples"):
        sources += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md", ".yaml", ".sh")]
    citing = [str(p.relative_to(ROOT)) for p in sources if outside in p.read_text(errors="replace")]
    assert not citing, f"cite {outside}, which is not in the repository: {citing}"
    assert "## How we write code" in (ROOT / "CONTRIBUTING.md").read_text()
