"""Section signs in the code name their document, and the section exists there (diagdocs audit).

A comment or docstring that cites ``§N`` must say which document it means in the same sentence
(``docs/program-scheduling.md §5.1``, ``RFC 9110 §9.1``): a bare ``§N`` relied on the file's
opening comment, and several documents share section numbers.  For a ``docs/*.md`` (or
``README.md``) citation the numbered heading must exist in that file (``## 13.`` or ``### 13.3``).

The scope of a sign is its sentence: in a ``#`` comment, the comment lines of its block (a code
line ends a block, so a trailing comment does not borrow the name of the comment above it); in a
docstring or string, the text since the last full stop, blank line or string start.  The last
document named in that scope before the sign is the one it cites.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("daemon", "actors", "sim", "bench", "scripts", "property_tests", "tests")
SIGN = re.compile(r"§(\d+(?:\.\d+)*)")
NAME = re.compile(r"(?<![\w/.-])(?:docs/[\w-]+\.md|README\.md)|RFC \d+|issue \d+")
BOUNDARY = re.compile(r'\.\s+(?=[A-Z(`"*])|"""|\n[ \t]*\n')
HEADING = re.compile(r"#+ (\d+(?:\.\d+)*)\.? ")


def headings(doc: str) -> set[str]:
    fenced, out = False, set()
    for line in (ROOT / doc).read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := HEADING.match(line)):
            out.add(m.group(1))
    return out


def scope(lines: list[str], index: int, column: int) -> str:
    """The text a sign at ``lines[index][column]`` is read in (see the module doc)."""
    line = lines[index]
    hash_at = line.find("#")
    if 0 <= hash_at < column:  # a ``#`` comment: this line's comment and the comment lines above it
        parts = [line[hash_at:column]]
        if not line[:hash_at].strip():
            k = index - 1
            while k >= 0 and lines[k].lstrip().startswith("#"):
                parts.insert(0, lines[k])
                k -= 1
        text = "\n".join(parts)
    else:
        text = "\n".join([*lines[max(0, index - 8) : index], line[:column]])
    cuts = [m.end() for m in BOUNDARY.finditer(text)]
    return text[cuts[-1] :] if cuts else text


def citations() -> list[tuple[str, str | None, str]]:
    """(where, the document named or None, section) of every section sign in the scanned code."""
    out = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            lines = path.read_text().splitlines()
            for i, line in enumerate(lines):
                for m in SIGN.finditer(line):
                    names = NAME.findall(scope(lines, i, m.start()))
                    out.append((f"{path.relative_to(ROOT)}:{i + 1}", names[-1] if names else None, m.group(1)))
    return out


def test_every_section_sign_names_its_document_and_the_section_exists() -> None:
    found = citations()
    assert len(found) > 100  # the scan reads the code (a broken pattern would find nothing)
    bare = [where for where, doc, _ in found if doc is None]
    assert not bare, f"section signs that name no document: {bare}"
    known: dict[str, set[str]] = {}
    missing = []
    for where, doc, section in found:
        if doc is not None and doc.endswith(".md"):
            if doc not in known:
                known[doc] = headings(doc) if (ROOT / doc).is_file() else set()
            if section not in known[doc]:
                missing.append(f"{where}: {doc} §{section}")
    assert not missing, f"cited sections that do not exist: {missing}"
