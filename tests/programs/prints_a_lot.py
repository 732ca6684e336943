"""A chatty script: many lines on stdout and stderr, a progress bar, colours, no newline at
the end. Usage: python prints_a_lot.py [LINES]"""
import sys

n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
for i in range(n):
    print(f"line {i} of {n}")
    if i % 1000 == 0:
        print(f"\x1b[31mwarning\x1b[0m at line {i}", file=sys.stderr)
for pct in (0, 50, 100):
    print(f"\rprogress {pct}%", end="", flush=True)
print()
print("done without a newline", end="")
