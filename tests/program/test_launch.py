"""Running a program in tuiprof's interpreter with ``python``'s own semantics."""
from __future__ import annotations

import os
import sys

import pytest

from tuiprof.errors import TuiprofError
from tuiprof.program.launch import parse_program, run_program


@pytest.mark.parametrize("launcher", ["python", "python3", "python3.12", "/usr/bin/python3.11",
                                      sys.executable])
def test_any_python_is_a_launcher(tmp_path, launcher):
    script = tmp_path / "x.py"
    script.write_text("")
    spec = parse_program([launcher, "-u", str(script), "--n", "3"])
    assert (spec.kind, spec.args, spec.name) == ("path", ("--n", "3"), "x.py")


def test_torchrun_is_accepted_as_it_is():
    """torchrun is python -m torch.distributed.run: its agent runs in the session process,
    its workers are the program's processes (followed)."""
    spec = parse_program(["/usr/local/bin/torchrun", "--nproc-per-node", "2", "tp.py", "--x"])
    assert (spec.kind, spec.target, spec.args) == ("module", "torch.distributed.run",
                                                   ("--nproc-per-node", "2", "tp.py", "--x"))
    assert spec.name == "torchrun tp.py"
    spec = parse_program(["python", "-m", "torch.distributed.run", "--nproc-per-node=2", "tp.py"])
    assert (spec.kind, spec.target) == ("module", "torch.distributed.run")
    with pytest.raises(TuiprofError, match="torchrun needs a script"):
        parse_program(["torchrun"])


def test_another_executable_is_a_native_program(tmp_path):
    spec = parse_program(["sh", "-c", "true"])
    assert (spec.kind, spec.launcher, spec.args, spec.name) == ("native", "sh", ("-c", "true"),
                                                                "sh")
    assert os.path.isabs(spec.target) and spec.argv == ["sh", "-c", "true"]
    with pytest.raises(TuiprofError, match="cannot run 'no-such-tool-xyz': no such program"):
        parse_program(["no-such-tool-xyz", "x.py"])


def test_the_program_sees_its_own_argv_path_and_main(tmp_path, capsys):
    script = tmp_path / "prog.py"
    script.write_text(
        "import sys\n"
        "print(sys.argv, sys.path[0], __name__)\n"
        "sys.exit(None if sys.argv[1] == 'ok' else int(sys.argv[1]))\n")
    argv, path0 = sys.argv[:], sys.path[0]
    res = run_program(parse_program(["python", str(script), "ok"]))
    out = capsys.readouterr().out
    assert out.strip() == f"{[str(script), 'ok']} {tmp_path} __main__"
    assert (res.status, res.how) == (0, "exited")
    assert run_program(parse_program(["python", str(script), "300"])).status == 300 & 0xFF
    assert sys.argv == argv and sys.path[0] == path0   # tuiprof's own, back as they were


def _script(tmp_path, code: str) -> str:
    path = tmp_path / "prog.py"
    path.write_text(code)
    return str(path)


def test_exit_with_a_message_and_a_raise(tmp_path, capsys):
    res = run_program(parse_program(["python", _script(tmp_path, "import sys\nsys.exit('no GPU here')\n")]))
    assert (res.status, capsys.readouterr().err) == (1, "no GPU here\n")
    res = run_program(parse_program(["python", _script(tmp_path, "def f():\n  1/0\nf()\n")]))
    assert (res.status, res.how, res.error) == (1, "raised", "ZeroDivisionError: division by zero")
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and "launch.py" not in err and os.sep + "runpy" not in err
    assert res.traceback[-1] == "ZeroDivisionError: division by zero"
