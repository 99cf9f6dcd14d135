"""What a preflight found: one line per check, a warning where a finding predicts a wrong table, with the option
that fixes it; the report the command prints and the Python API returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import List, Optional


@dataclass(frozen=True)
class Finding:
    """One line of the report: which check (`data`, `clean`, `noise`, `normalization`, `labels`, `denoiser`,
    `sigma`, `published`), what it measured, and for a warning what fixes it (`fix`: an option, or an action).
    A check whose paired test had too little power for its sample is `inconclusive` instead of passing."""

    check: str
    text: str
    warning: bool = False
    fix: Optional[str] = None
    inconclusive: bool = False          # a paired test too weak to pass or fail on this sample (paired.py)

    def line(self) -> str:
        if self.warning:
            return f"warning: {self.text}" + (f"; fix: {self.fix}" if self.fix else "")
        if self.inconclusive:
            return f"inconclusive: {self.text}"
        return f"{self.check + ':':<15}{self.text}"


@dataclass
class PreflightReport:
    """A preflight's findings (in the order the report prints them) and the numbers behind them (`measured`:
    accuracies as fractions, errors in [0, 1] pixel units); `seconds`: its wall time."""

    title: str
    findings: List[Finding] = field(default_factory=list)
    measured: dict = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def warnings(self) -> List[Finding]:
        return [f for f in self.findings if f.warning]

    @property
    def inconclusive(self) -> List[Finding]:
        """Checks whose paired test could not tell on this sample (each says how many more images it needs)."""
        return [f for f in self.findings if f.inconclusive]

    @property
    def ok(self) -> bool:
        """No finding predicts a wrong table."""
        return not self.warnings

    def checks(self) -> List[str]:
        """The checks that ran (each printed at least one line)."""
        return list(dict.fromkeys(f.check for f in self.findings))

    def add(self, check: str, text: str, warning: bool = False, fix: Optional[str] = None,
            inconclusive: bool = False) -> None:
        self.findings.append(Finding(check, text, warning, fix, inconclusive))

    def lines(self) -> List[str]:
        """The report as printed: the title, the measurements, the inconclusive checks, then the warnings."""
        notes = [f.line() for f in self.findings if not (f.warning or f.inconclusive)]
        weak = [f.line() for f in self.inconclusive]
        warnings = [f.line() for f in self.warnings]
        tail = f"preflight: {len(warnings)} warning(s)" if warnings else "preflight: no warnings"
        if weak:
            tail += f", {len(weak)} check(s) inconclusive"
        return [f"preflight: {self.title}", *notes, *weak, *warnings,
                f"{tail} ({self.seconds:.1f} s); nothing was written"]

    def text(self) -> str:
        return "\n".join(self.lines()) + "\n"

    def as_dict(self) -> dict:
        return {"title": self.title, "ok": self.ok, "inconclusive": len(self.inconclusive), "seconds": self.seconds,
                "findings": [asdict(f) for f in self.findings], "measured": self.measured}
