from tuiprof.cli import main

raise SystemExit(main())
