"""Every relative link of the README, docs/, the benchmark results' READMEs and the studies' index names a file that exists
and, with an #anchor, a heading of that file (GitHub's anchors: lower case, punctuation dropped, spaces
to hyphens, a repeated heading numbered -1, -2, ...)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def pages() -> list:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "bench").rglob("README.md")),
            ROOT / "studies" / "README.md"]


def _prose(text: str) -> str:
    """The text outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return "\n".join(out)


def anchors(path: Path) -> set:
    seen, out = {}, set()
    for line in _prose(path.read_text()).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(path: Path) -> list:
    bad = []
    for target in LINK.findall(_prose(path.read_text())):
        if re.match(r"^[a-z]+:", target):          # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        where = (path.parent / file).resolve() if file else path
        if not where.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            bad.append(f"{target} (no such heading)")
    return bad


def test_every_relative_link_resolves():
    bad = {str(p.relative_to(ROOT)): hits for p in pages() if (hits := broken_links(p))}
    assert not bad, bad


def test_the_anchors_are_githubs(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# A `b` (c)\n## Smoke runs (`--smoke`)\n## The reach: 2.5 sigma\n## x\n## x\n"
                    "```\n# not a heading\n```\n[ok](#smoke-runs---smoke) [ok](#x-1) [bad](#not-a-heading) "
                    "[bad](missing.md)\n")
    assert anchors(page) == {"a-b-c", "smoke-runs---smoke", "the-reach-25-sigma", "x", "x-1"}
    assert broken_links(page) == ["#not-a-heading (no such heading)", "missing.md (no such file)"]


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
