"""The Textual front end of tuiprof.

Panes only *read* the session: the app pulls ``control.store.view()`` on its own timer and
acts on the session only through :class:`tuiprof.control.SessionControl`. Importing this
package does not import Textual; :mod:`tuiprof.ui.app` does.

Entry points: :func:`tuiprof.ui.app.run_app` (CLI) and :func:`tuiprof.ui.app.make_app`
(CLI and tests); :class:`tuiprof.ui.static.StaticViewControl` serves ``tuiprof view``.
"""
