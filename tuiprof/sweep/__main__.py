"""``python -m tuiprof.sweep``."""

from tuiprof.sweep.cli import main

raise SystemExit(main())
