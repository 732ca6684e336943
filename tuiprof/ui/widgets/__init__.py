"""The panes of the main screen, one module each. Each has ``show(view, ctx)``, called by the
app's refresh timer on the main thread with an immutable StoreView; none reads a thread."""
