import os
import sys

from tuiprof.cli import main
from tuiprof.cli.common import ending_at_once

code = main()
if ending_at_once():  # written and done: no interpreter teardown to wait for
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
raise SystemExit(code)
