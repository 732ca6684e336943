"""A script that ends with sys.exit(3) after two marked steps."""
import sys

import tuiprof

for i in range(2):
    with tuiprof.step("decode"):
        print(f"working {i}")
print("giving up", file=sys.stderr)
sys.exit(3)
