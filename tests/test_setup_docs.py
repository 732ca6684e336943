"""CI installs and tests the project exactly as README's set-up tells a user to: the same
virtual environment, the same install, the same test command (run by the environment's
python)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands(lines) -> list[str]:
    out = []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        for part in line.split("&&"):
            words = [w for w in part.split() if w != "-q"]
            if words:
                out.append(" ".join(words).replace('"$PY"', "python"))
    return out


def test_ci_runs_the_readmes_set_up_in_a_virtual_environment():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    setup = readme.split("## Set-up", 1)[1]
    block = re.search(r"```bash\n(.*?)```", setup, re.S).group(1)
    user = _commands(block.splitlines())
    ci = _commands((ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines())
    venv = "python3 -m venv --system-site-packages .venv"
    assert venv in user and venv in ci
    for cmd in user:
        if cmd.startswith(("python -m pip install", "python -m pytest")):
            assert cmd in ci, (cmd, ci)
    # CI's python is the environment's, never the system's
    assert "PY=.venv/bin/python" in ci
    assert not [c for c in ci if c.startswith(("python3 -m pip", "python3 -m pytest", "pytest",
                                               "pip "))], ci
