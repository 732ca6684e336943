"""A server of its own: a queue of requests, a loop that batches them into steps, each step
marked with tuiprof.step and each request reported with tuiprof.request_*. Runs the same with
or without tuiprof (the marks then do nothing). One deliberate mistake: a token for a request
that never arrived (tuiprof counts it; the server goes on)."""
import sys
import time

import tuiprof

N, OUT, BATCH = 6, 5, 3
queue = [f"req-{i}" for i in range(N)]
arrived = {}
running = {}
done = []
t0 = time.perf_counter()
i = 0
while len(done) < N:
    # one request arrives every step until all have
    if i < N:
        rid = queue[i]
        tuiprof.request_arrived(rid, prompt_tokens=12)
        arrived[rid] = True
        i += 1
    waiting = [r for r in queue if r in arrived and r not in running and r not in done]
    for r in waiting[: BATCH - len(running)]:
        running[r] = 0
    if not running:
        continue
    with tuiprof.step("decode", tokens=len(running)):
        time.sleep(0.004)  # the model
    for r in list(running):
        running[r] += 1
        tuiprof.request_token(r)
        if running[r] == OUT:
            tuiprof.request_finished(r, reason="length")
            done.append(r)
            del running[r]
tuiprof.request_token("never-arrived")
print(f"served {len(done)} requests in {time.perf_counter() - t0:.2f} s", flush=True)
sys.exit(0)
