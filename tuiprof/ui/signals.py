"""How the app ends on a signal: SIGTERM and SIGINT quit like ``q``, SIGHUP (the terminal
gone) stops the session and writes the automatic snapshot without the terminal. A part of
:class:`~tuiprof.ui.app.TuiprofApp`: it uses the app's ``control``, ``action_quit``,
``_final_snapshot`` and ``_quitting``, and the ``_signalled`` list and ``_old_hup`` the app's
constructor makes."""
from __future__ import annotations

import asyncio
import os
import signal
import threading
from typing import Any

from ..terminal import detach_terminal


class SignalQuit:
    """The signal handlers of the app (installed with ``handle_signals=True``)."""

    def _install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT quit like ``q``: the session stops, CUPTI is flushed and finalised
        and the automatic snapshot is written; a second signal exits at once. SIGHUP (the
        terminal closed: an SSH drop) does the same without the terminal, see ``_on_hangup``."""
        try:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig)
            if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # nohup: stay running
                self._old_hup = signal.signal(signal.SIGHUP, self._on_hangup)
        except (NotImplementedError, RuntimeError, ValueError, AttributeError):
            pass  # not the main thread, or no POSIX signals: keys still quit

    def on_unmount(self) -> None:
        self.restore_signal_handlers()

    def restore_signal_handlers(self) -> None:
        if self._old_hup is not None:  # the loop's own handlers go with the loop
            try:
                signal.signal(signal.SIGHUP, self._old_hup)
            except (ValueError, TypeError):
                pass
            self._old_hup = None

    def _on_signal(self, signum: int) -> None:
        self._signalled.append(signum)
        if len(self._signalled) > 1 or self._quitting:
            self.exit(return_code=128 + signum)
            return
        self.action_quit()

    def _on_hangup(self, signum: int, frame: Any = None) -> None:
        """The terminal is gone: nothing can be drawn or read any more, and Textual's output
        thread dies on its first failed write (after which the event loop blocks on it). So the
        standard streams are pointed at /dev/null, the session is stopped and the automatic
        snapshot written on a plain thread, and the process then ends with 128 + SIGHUP."""
        self._signalled.append(signum)
        if len(self._signalled) > 1:
            return
        detach_terminal()
        threading.Thread(target=self._hangup_stop, args=(signum,), name="tuiprof-hangup",
                         daemon=True).start()

    def _hangup_stop(self, signum: int) -> None:
        try:
            self.control.stop()
        except Exception:
            pass
        self._final_snapshot()
        try:
            self.control.close()
        except Exception:
            pass
        os._exit(128 + signum)
