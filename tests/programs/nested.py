"""Processes within processes: ``nested.py N`` starts ``nested.py N-1`` with subprocess (a new
Python interpreter), and so on; the last one runs custom_loop.py's decode loop (torch, steps
marked with tuiprof.step). Usage: python nested.py [DEPTH]"""
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).parent
depth = int(sys.argv[1]) if len(sys.argv) > 1 else 2
print(f"nested: depth {depth}", flush=True)
if depth > 0:
    sys.exit(subprocess.run([sys.executable, str(HERE / "nested.py"), str(depth - 1)]).returncode)
sys.argv = [str(HERE / "custom_loop.py"), "--steps", "3"]
exec(compile((HERE / "custom_loop.py").read_text(), sys.argv[0], "exec"))
