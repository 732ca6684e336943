"""A real CUDA out-of-memory in the live app, and going on afterwards (docs/reliability.md).

A ballast process holds all but ``--free-gib`` of the GPU's memory (another job on a shared
GPU). Then the live app (the Textual app headless under ``run_test``, over a session process,
as ``tuiprof --model`` runs) starts a session whose prompt is far beyond what is left; the OOM
must appear on the status line with its memory figures while the app keeps answering keys; ``e``
exports what was measured; ``q`` ends the session and writes the automatic snapshot. Then, on the
same GPU with the ballast still there, the user "changes settings and goes on": a second session
with a short prompt must generate. One row per session at the end.

    python bench/verify/oom_live.py --free-gib 7 --out $OUT/oom
"""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench._common import KeyTimer  # noqa: E402

BALLAST = """
import sys, time, torch
free, total = torch.cuda.mem_get_info()
keep = int(float(sys.argv[1]) * 1024**3)
x = torch.empty(max(0, free - keep), dtype=torch.uint8, device="cuda")
print(f"ballast {x.numel() / 1024**3:.1f} GiB of {total / 1024**3:.1f} GiB; free now "
      f"{torch.cuda.mem_get_info()[0] / 1024**3:.2f} GiB", flush=True)
time.sleep(3600)
"""


async def _session(label: str, engine_kwargs: dict, out: Path, wait_tokens: int) -> dict:
    from tuiprof.spec import EngineSpec, ProfilerOptions
    from tuiprof.sessions import RemoteControl
    from tuiprof.ui.app import make_app

    d = out / label
    d.mkdir(parents=True, exist_ok=True)
    kw = dict(engine_kwargs)
    ctl = RemoteControl(ProfilerOptions(engine=EngineSpec.resolve(kw.pop("model_spec"), **kw)),
                        {"ring_tokens": 16})
    ctl.start()
    app = make_app(ctl, title=label, export_dir=d, auto_snapshot=True, refresh_hz=4.0)
    keys = KeyTimer(app)
    row: dict = {"session": label, "prompt_len": engine_kwargs["prompt_len"]}
    t0 = time.monotonic()
    async with app.run_test(size=(200, 50)) as pilot:
        while time.monotonic() - t0 < 300:
            st, v = ctl.status, app.view
            decoded = v.counters.get("tokens", 0) if v is not None else 0
            if st.state == "error" or decoded > wait_tokens:
                break
            await asyncio.sleep(0.25)
        row["state"] = ctl.status.state
        row["message"] = ctl.status.message
        row["seconds"] = round(time.monotonic() - t0, 1)
        lat = await keys.press(5)                # the app still answers keys
        row["keys_answered"] = len(lat)
        row["key_max_ms"] = round(max(lat), 1) if lat else None
        status_line = str(app.screen.query_one("#status").render())
        row["status_line_has_oom"] = "out of memory" in status_line.lower()
        await pilot.press("e")
        t1 = time.monotonic()
        while not list(d.glob("tuiprof-*.json")) and time.monotonic() - t1 < 60:
            await asyncio.sleep(0.2)
        await pilot.press("q")
        await app.workers.wait_for_complete()
        await pilot.pause()
    ctl.close()
    snaps = sorted(d.glob("tuiprof-*.json"))
    row["snapshots"] = len(snaps)
    if snaps:
        snap = json.loads(snaps[-1].read_text())
        row["snapshot_tokens"] = len(snap.get("tokens", []))
        allocs = snap.get("allocs") or {}
        row["snapshot_startup_mallocs"] = (allocs.get("startup") or {}).get("mallocs")
        row["snapshot_error_events"] = [e for e in snap.get("events", []) if "error" in str(e)][:1]
    v = ctl.store.view(raw=False)
    dec = [t for t in v.tokens if t.phase == "decode" and t.done]
    row["decode_tokens"] = len(dec)
    if len(dec) > 1:
        row["tokens_per_s"] = round(len(dec) / ((dec[-1].end_ns - dec[0].start_ns) / 1e9), 1)
    row["exit_code_session_process"] = ctl._proc.exitcode
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--free-gib", type=float, default=7.0)
    p.add_argument("--prompt-len", type=int, default=40000)
    p.add_argument("--out", default="/tmp/oom_live")
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    ballast = subprocess.Popen([sys.executable, "-c", BALLAST, str(a.free_gib)],
                               stdout=subprocess.PIPE, text=True)
    print(ballast.stdout.readline().strip(), flush=True)
    rows = []
    try:
        rows.append(asyncio.run(_session("oom", dict(
            model_spec=a.model, prompt_len=a.prompt_len, max_len=a.prompt_len + 64,
            max_new_tokens=32, loop=True), out, 10)))
        print(json.dumps(rows[-1], default=str), flush=True)
        rows.append(asyncio.run(_session("after", dict(
            model_spec=a.model, prompt_len=16, max_len=1024, max_new_tokens=256, loop=True),
            out, 60)))
        print(json.dumps(rows[-1], default=str), flush=True)
    finally:
        ballast.kill()
        ballast.wait()
    print("\n| session | prompt | state | message (status line) | keys answered (max ms) | "
          "snapshot tokens | decode tokens | tokens/s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['session']} | {r['prompt_len']} | {r['state']} | {r['message'][:160]} | "
              f"{r['keys_answered']} ({r['key_max_ms']}) | {r.get('snapshot_tokens')} | "
              f"{r['decode_tokens']} | {r.get('tokens_per_s', '–')} |")
    (out / "oom_live.json").write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
