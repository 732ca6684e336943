"""A finding: what limits a run, its estimated impact and what to try. The one type every
rule returns (kernels and launches: findings.py, requests: request_rules.py, ranks:
cross_rank.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Finding", "SEVERITIES", "severity"]

SEVERITIES = ("high", "medium", "low", "info")


@dataclass(frozen=True, slots=True)
class Finding:
    id: str
    title: str
    severity: str                          # high | medium | low | info
    impact_ms_per_token: float | None      # estimated ms per decode token to win
    share: float | None                    # share of the token (or of GPU time) concerned
    numbers: dict = field(default_factory=dict)
    evidence: str = ""
    advice: str = ""

    def to_dict(self) -> dict:
        """JSON-ready form (snapshots, exports)."""
        return {"id": self.id, "title": self.title, "severity": self.severity,
                "impact_ms_per_token": self.impact_ms_per_token, "share": self.share,
                "numbers": dict(self.numbers), "evidence": self.evidence, "advice": self.advice}


def severity(impact_ms: float | None, token_ms: float) -> str:
    if impact_ms is None or token_ms <= 0:
        return "info"
    r = impact_ms / token_ms
    return "high" if r >= 0.25 else ("medium" if r >= 0.05 else "low")
