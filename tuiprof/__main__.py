import sys

from tuiprof.engine.bytecode import keep_own

keep_own(sys.argv[1:])  # before the command's imports: they compile at every start without it

from tuiprof.cli import main  # noqa: E402
from tuiprof.cli.common import ending_at_once, exit_now  # noqa: E402

code = main()
if ending_at_once():  # written and done: no interpreter teardown to wait for
    exit_now(code)
raise SystemExit(code)
