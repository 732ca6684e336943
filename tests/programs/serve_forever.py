"""A toy server: works until Ctrl-C, then shuts down cleanly and re-raises."""
import time

print("serving", flush=True)
try:
    while True:
        time.sleep(0.02)
except KeyboardInterrupt:
    print("shutting down", flush=True)
    raise
