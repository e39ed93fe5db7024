"""A fresh clone has everything its tests read: nothing under tests/ or .ci/ reaches outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# A path out of the repository: the sibling "shared" directory the tests once read, or
# climbing past the repository root with parents[N]. (Other "../" strings in tests are
# hostile inputs for the file tools, not paths the tests read.)
OUTSIDE = re.compile(r"""\.\./shared\b|/\s*["']shared["']|parents\[(\d+)\]""")


def test_tests_never_read_outside_the_repository() -> None:
    offenders = []
    for path in sorted([*(REPO / "tests").rglob("*.py"), REPO / ".ci" / "run"]):
        if path == Path(__file__).resolve():
            continue
        depth = len(path.relative_to(REPO).parts) - 1  # parents[depth] is the repository root
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in OUTSIDE.finditer(line):
                if match.group(1) is None or int(match.group(1)) > depth:
                    offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "reads outside the repository:\n" + "\n".join(offenders)


def test_the_behaviour_cases_are_in_the_repository() -> None:
    cases = REPO / "tests" / "cases"
    assert sorted(p.name for p in cases.glob("*.json")), "tests/cases/*.json are missing"
