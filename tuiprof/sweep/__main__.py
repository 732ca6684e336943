"""``python -m tuiprof.sweep``."""

from tuiprof.cli.sweep import main

raise SystemExit(main())
