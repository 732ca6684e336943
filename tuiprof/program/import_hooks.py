"""Run a hook on a module right after the program imports it (a meta-path finder that steps
aside for the real finders and wraps their loader): the step sources patch a library's or the
program's own functions when they appear, without importing them first."""
from __future__ import annotations

import functools
import importlib.abc
import importlib.util
from typing import Any, Callable


class PostImport(importlib.abc.MetaPathFinder):
    """Calls ``hooks[name](module)`` right after the module ``name`` has been executed."""

    def __init__(self, hooks: dict[str, Callable[[Any], None]]) -> None:
        self.hooks = dict(hooks)
        self._busy: set[str] = set()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        hook = self.hooks.get(name)
        if hook is None or name in self._busy:
            return None
        self._busy.add(name)
        try:
            spec = importlib.util.find_spec(name)  # the real finders (we step aside)
        finally:
            self._busy.discard(name)
        if spec is None or spec.loader is None:
            return spec
        # the hook stays until the module is executed: ``importlib.util.find_spec(name)``
        # (transformers asks it of "torch" to see whether torch is installed) comes here too,
        # and the import that follows it must still run the hook
        spec.loader = HookedLoader(spec.loader, lambda m: self._ran(name, m))
        return spec

    def _ran(self, name: str, module: Any) -> None:
        hook = self.hooks.pop(name, None)
        if hook is not None:
            hook(module)


class HookedLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, hook: Callable[[Any], None]) -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        self._hook(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package, ...
        return getattr(self._loader, name)


class Patches:
    """Attributes a step source replaces on modules or classes: patched now if their module is
    imported, else when the program imports it, and all restored in reverse order."""

    def __init__(self) -> None:
        self._restore: list[tuple[Any, str, Any]] = []
        self._finder: PostImport | None = None

    def on_import(self, hooks: dict[str, Callable[[Any], None]]) -> None:
        """``hooks[module](module)`` now for each module already imported, at its import for
        the others."""
        import sys  # noqa: PLC0415

        later = {}
        for name, hook in hooks.items():
            mod = sys.modules.get(name)
            if mod is not None:
                hook(mod)
            else:
                later[name] = hook
        if later:
            self._finder = PostImport(later)
            sys.meta_path.insert(0, self._finder)

    def replace(self, owner: Any, name: str, new: Any) -> None:
        """``owner.name = new``, remembering what was there: its own attribute (descriptors
        such as staticmethod included), or nothing when it was inherited (then the restore
        deletes the new one)."""
        self._restore.append((owner, name, owner.__dict__.get(name, _INHERITED)))
        setattr(owner, name, new)

    def wrap(self, owner: Any, name: str, failed: Callable[[str, BaseException], None],
             where: str, *, before: Callable[..., Any] | None = None,
             after: Callable[..., None] | None = None, stamp: Callable[[], int] | None = None,
             hooks: Any = None) -> None:
        """Replace ``owner.name`` (its own attribute; nothing happens when it has none) by a
        wrapper around the original: ``before(*args, **kwargs)`` runs first and ``after(seen,
        out, *args, **kwargs)`` last, ``out`` being the original's result and ``seen`` what
        ``before`` returned, or ``stamp()`` read just before the original (None without
        either). Bookkeeping never breaks the program: what ``before`` or ``after`` raises goes
        to ``failed(where, exc)``. ``hooks``: the session's own-time clock
        (:class:`~tuiprof.collect.own_cost.HookClock`); ``before`` and ``after`` are its spans."""
        if owner is None or name not in owner.__dict__:
            return
        orig = owner.__dict__[name]

        def note(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            h = hooks.enter() if hooks is not None else 0.0
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                failed(where, exc)
                return None
            finally:
                if hooks is not None:
                    hooks.leave(h)

        @functools.wraps(orig)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            seen = stamp() if stamp is not None else None
            if before is not None:
                seen = note(before, *args, **kwargs)
            out = orig(*args, **kwargs)
            if after is not None:
                note(after, seen, out, *args, **kwargs)
            return out

        self.replace(owner, name, wrapper)

    def restore(self) -> None:
        """Drop the import hook and put every replaced attribute back."""
        import sys  # noqa: PLC0415

        if self._finder is not None:
            try:
                sys.meta_path.remove(self._finder)
            except ValueError:
                pass
            self._finder = None
        for owner, name, orig in reversed(self._restore):
            if orig is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, orig)
        self._restore.clear()


_INHERITED = object()
