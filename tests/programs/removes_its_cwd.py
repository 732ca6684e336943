"""Two steps, then leaves its working directory and removes it (a clean-up of a scratch
directory that is also where tuiprof was started)."""
import os
import shutil

import tuiprof

for _ in range(2):
    with tuiprof.step("decode"):
        print("working")
old = os.getcwd()
os.chdir("/")
shutil.rmtree(old)
print("removed", old)
