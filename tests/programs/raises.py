"""A loop that fails at its third step, as programs do."""
import tuiprof


def check(step):
    if step == 2:
        raise ValueError(f"bad shape at step {step}: expected [2, 64]")


for step in range(5):
    with tuiprof.step("decode", tokens=2):
        print(f"step {step}")
        check(step)
