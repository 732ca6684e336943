"""Commands over files: ``models``, ``view``, ``replay``, ``export``, ``diff``."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import TuiprofError, safe_text
from ..export._atomic import check_output, check_output_dir
from ..text import printable
from .common import print_summary, say, write_outputs


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    if name == "view":
        p.add_argument("snapshot")
    elif name == "replay":
        p.add_argument("file")
        p.add_argument("--speed", type=float, default=1.0,
                       help="1 = recorded speed, 0 = as fast as possible")
        p.add_argument("--loop", action="store_true")
        p.add_argument("--headless", action="store_true")
        p.add_argument("--json", help="snapshot path (headless)")
        p.add_argument("--ring-tokens", type=int, default=64)
        p.add_argument("--export-dir", default=".")
    elif name == "export":
        from ..export.registry import with_flags  # noqa: PLC0415
        p.add_argument("snapshot")
        for e in with_flags():
            p.add_argument(e.flag, metavar=e.target.upper(), dest=f"export_{e.name}",
                           help=f"write {e.help}")
    elif name == "diff":
        p.add_argument("a")
        p.add_argument("b")
        p.add_argument("--markdown", action="store_true")
        p.add_argument("--rank", type=int, default=None, metavar="N",
                       help="in a snapshot of several ranks or processes, compare rank (or "
                            "process) N of each (default: rank 0; of a program's processes, "
                            "the first that did GPU work or marked steps)")


def run(name: str, args: argparse.Namespace) -> int:
    return {"models": lambda a: _cmd_models(), "view": _cmd_view, "replay": _cmd_replay,
            "export": _cmd_export, "diff": _cmd_diff}[name](args)


def _cmd_models() -> int:
    from ..engine.model_defs import get_model_def, list_models, param_count, weight_bytes  # noqa: PLC0415

    print(f"{'model':<24} {'family':<12} {'params':>15} {'bf16 weights':>13}  description")
    for name in list_models():
        try:
            d = get_model_def(name)
            params, wbytes = param_count(d), weight_bytes(d, "bfloat16")
        except Exception as exc:  # a broken definition file is listed, not fatal
            print(f"{name:<24} (unreadable: {safe_text(exc)})")
            continue
        desc = printable(d.description or "", 60)
        print(f"{name:<24} {d.family:<12} {params:>15,} {wbytes / 1e9:>10.2f} GB  {desc}")
    return 0


def _cmd_view(args: argparse.Namespace) -> int:
    from ..export.snapshot import read_any_snapshot  # noqa: PLC0415
    from ..ui.app import run_app, view_control  # noqa: PLC0415

    view = read_any_snapshot(args.snapshot)
    name = safe_text(Path(args.snapshot).name)
    return run_app(view_control(view, name), title=f"tuiprof view {name}",
                   export_dir=Path("."), auto_snapshot=False)


def _cmd_replay(args: argparse.Namespace) -> int:
    from ..collect.replay import ReplayControl, load_recording  # noqa: PLC0415
    from ..store import SessionStore  # noqa: PLC0415

    if args.ring_tokens < 1 or args.speed < 0:
        raise TuiprofError("--ring-tokens must be positive and --speed 0 or more")
    out = Path(args.json or Path(args.file).name.split(".")[0] + ".snapshot.json")
    if args.headless:
        check_output(out, "--json" if args.json else "the snapshot")
    rec = load_recording(args.file)
    store = SessionStore(ring_tokens=args.ring_tokens)
    if args.headless:
        from ..collect.replay import replay_into  # noqa: PLC0415
        replay_into(rec, store, speed=0.0)
        write_outputs(store.view(), out, None)
        print_summary(store.view())
        return 0
    from ..ui.app import run_app  # noqa: PLC0415
    ctl = ReplayControl(rec, store, speed=args.speed, loop=args.loop)
    ctl.start()
    return run_app(ctl, title=f"tuiprof replay {Path(args.file).name}",
                   export_dir=Path(args.export_dir), auto_snapshot=False)


def _cmd_export(args: argparse.Namespace) -> int:
    from ..export.registry import with_flags, write  # noqa: PLC0415
    from ..export.snapshot import read_any_snapshot  # noqa: PLC0415

    asked = [(e, getattr(args, f"export_{e.name}")) for e in with_flags()
             if getattr(args, f"export_{e.name}", None)]
    if not asked:
        flags = ", ".join(f"{e.flag} {e.target.upper()}" for e in with_flags())
        raise TuiprofError(f"nothing to export: give one or more of {flags}")
    for e, path in asked:   # before reading a large snapshot: a bad path says so at once
        (check_output_dir if e.target == "dir" else check_output)(path, e.flag)
    view = read_any_snapshot(args.snapshot)  # all ranks of a multi-rank snapshot
    reversed_ = sum(n for v in getattr(view, "views", None) or (view,)
                    if type(n := v.counters.get("ends_before_start")) is int and n > 0)
    if reversed_:
        say(f"tuiprof: {reversed_} records that end before they start are left out (no "
            "negative durations; counters.ends_before_start)")
    for e, path in asked:
        written = write(e.name, view, Path(path))
        for p in (written if isinstance(written, (list, tuple)) else [written]):
            print(printable(p))
    return 0


def _one_view(path: str, rank: int | None):
    """The view ``diff`` compares: the snapshot's, or one rank's or process's of it."""
    from ..export.snapshot import read_any_snapshot  # noqa: PLC0415
    from ..store.rank_set import cycle_active, is_process_set  # noqa: PLC0415

    snap = read_any_snapshot(path)
    views = getattr(snap, "views", None)
    if views is None:
        if rank not in (None, 0):
            raise TuiprofError(f"{safe_text(Path(path).name)} holds one process: drop --rank")
        return snap
    if rank is None:
        rank = cycle_active(views, -1) if is_process_set(snap) else 0
    if not 0 <= rank < len(views):
        raise TuiprofError(f"--rank {rank}: {safe_text(Path(path).name)} holds ranks 0 to "
                           f"{len(views) - 1}")
    return views[rank]


def _cmd_diff(args: argparse.Namespace) -> int:
    from ..export.diff import diff, render_text  # noqa: PLC0415
    result = diff(_one_view(args.a, args.rank), _one_view(args.b, args.rank))
    print(render_text(result, markdown=args.markdown))
    return 0
