"""One step, then removes the directory its snapshot was to be written to."""
import shutil
import sys

import tuiprof

with tuiprof.step("decode"):
    print("working")
shutil.rmtree(sys.argv[1])
