"""tuiprof's start-up hook for the processes of a profiled program (tuiprof/sessions/follow.py).

This directory is put first on PYTHONPATH of a program run under ``tuiprof run``, so Python
imports this module at interpreter start, before the program's main module. It

1. takes this directory off ``sys.path`` again (the program sees the path it would have);
2. runs the program's own ``sitecustomize`` if one is on the path (it stays the module the
   program sees as ``sitecustomize``; without one, ``import sitecustomize`` fails as usual);
3. registers the process with the tuiprof session named in ``TUIPROF_FOLLOW``.

Nothing is printed and no error escapes: an interpreter tuiprof cannot run in (another
Python version) runs the program as it would without tuiprof. Keep this file importable by
any Python 3.
"""
import os
import sys


def _tuiprof_boot():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    ours = sys.modules.pop("sitecustomize", None)
    theirs, failure = None, None
    try:
        import importlib
        theirs = importlib.import_module("sitecustomize")
    except ImportError as exc:
        if getattr(exc, "name", None) != "sitecustomize":
            failure = exc
    except Exception as exc:  # their error is reported by site as it would be
        failure = exc
    if theirs is None:
        sys.modules.pop("sitecustomize", None)
        if ours is not None:
            sys.modules["sitecustomize"] = ours   # until this import ends (see below)
    if os.environ.get("TUIPROF_FOLLOW") and sys.version_info >= (3, 10):
        root = os.environ.get("TUIPROF_ROOT")
        added = False
        try:
            try:
                import tuiprof.sessions.follow as follow
            except ImportError:
                if not root:
                    raise
                sys.path.append(root)
                added = True
                import tuiprof.sessions.follow as follow
            follow.start()
        except Exception:
            pass
        finally:
            if added and root in sys.path:
                sys.path.remove(root)
    return theirs, failure


_theirs, _failure = _tuiprof_boot()
del _tuiprof_boot
if _failure is not None:
    raise _failure
if _theirs is None:
    # No sitecustomize of the program's: the import that site is running fails as if this
    # module did not exist (site ignores an ImportError named "sitecustomize").
    raise ImportError("no sitecustomize", name="sitecustomize")
