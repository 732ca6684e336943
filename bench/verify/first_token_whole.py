"""First token and the whole process: one-token headless runs of the built-in engine
(``python -m tuiprof --model M --headless --max-new-tokens 1``), from process start to exit.

``--first``: one run first with an empty bytecode tree of its own (``TUIPROF_PYCACHE``) and
empty caches (``XDG_CACHE_HOME``): the first start on a machine, under ``python -X importtime``
when ``--importtime`` is given (the file goes to $OUT: what the imports cost, module by
module). Then ``--rounds`` second starts of each tree in
``--trees``, the order rotating a round. Per run: the whole process (spawn to exit), the
snapshot's first token (``meta.startup.first_token_s``, from the process's start) and its
phases; the table gives medians::

    python bench/verify/first_token_whole.py --trees before=OLD_CHECKOUT,after=. --rounds 3 --first
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one(tree: Path, model: str, device: str | None, env_extra: dict, importtime: Path | None,
        timeout: float) -> dict:
    work = Path(tempfile.mkdtemp(prefix="tuiprof-ftw-"))
    out = work / "h.json"
    cmd = [sys.executable] + (["-X", "importtime"] if importtime else []) + [
        "-m", "tuiprof", "--model", model, "--headless", "--max-new-tokens", "1", "--json",
        str(out)] + (["--device", device] if device else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tree), os.environ.get("PYTHONPATH", "")]), **env_extra)
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    whole = time.monotonic() - t0
    if importtime is not None:
        importtime.write_text(r.stderr)
    res: dict = {"rc": r.returncode, "whole_s": round(whole, 2)}
    try:
        startup = json.loads(out.read_text())["meta"]["startup"]
        res["first_token_s"] = startup.get("first_token_s")
        res["phases"] = {p["name"]: p["seconds"] for p in startup.get("phases", [])}
    except (OSError, ValueError, KeyError) as exc:
        res["error"] = f"{type(exc).__name__}: {exc}; {r.stderr[-300:]}"
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", default="this=.", help="name=PATH,... (PATH: a source tree)")
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--device")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--first", action="store_true", help="a first start (empty bytecode tree)")
    ap.add_argument("--importtime", action="store_true", help="-X importtime on the first start")
    ap.add_argument("--timeout", type=float, default=120.0)
    a = ap.parse_args()
    out = Path(os.environ.get("OUT", ".")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    trees = [(n, Path(p).resolve()) for n, p in (kv.split("=", 1) for kv in a.trees.split(","))]
    results: list[dict] = []
    if a.first:
        name, tree = trees[-1]
        # a fresh machine: no bytecode tree and none of tuiprof's caches (transformers' import
        # structure among them)
        fresh = {"TUIPROF_PYCACHE": tempfile.mkdtemp(prefix="tuiprof-pyc-first-"),
                 "XDG_CACHE_HOME": tempfile.mkdtemp(prefix="tuiprof-xdg-first-")}
        r = one(tree, a.model, a.device, fresh,
                out / "first_start_importtime.txt" if a.importtime else None, a.timeout)
        r.update(tree=name, kind="first start")
        results.append(r)
        print(json.dumps(r), flush=True)
    for i in range(a.rounds):
        k = i % len(trees)
        for name, tree in trees[k:] + trees[:k]:
            r = one(tree, a.model, a.device, {}, None, a.timeout)
            r.update(tree=name, kind="second start", round=i + 1)
            results.append(r)
            print(json.dumps(r), flush=True)
    (out / "first_token_whole.json").write_text(json.dumps(results, indent=1))
    print(f"\n{a.model}: one-token headless runs, whole process and first token (medians)")
    print("| tree | start | runs | whole process s | first token s | after the first token s |")
    print("|---|---|---|---|---|---|")
    for kind in ("first start", "second start"):
        for name, _tree in trees:
            rs = [r for r in results if r["tree"] == name and r["kind"] == kind
                  and r.get("first_token_s") is not None]
            if not rs:
                continue
            w = statistics.median(r["whole_s"] for r in rs)
            f = statistics.median(r["first_token_s"] for r in rs)
            tail = statistics.median(r["whole_s"] - r["first_token_s"] for r in rs)
            each = ", ".join(str(r["whole_s"]) for r in rs)
            print(f"| {name} | {kind} | {len(rs)} | {w:.2f} ({each}) | {f:.2f} | {tail:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
