"""A decode loop whose steps are calls of looplib.Engine.step, with a prefill before it;
nothing in it knows of tuiprof."""
import looplib

looplib.prefill_step(8)
engine = looplib.Engine()
x = 0
for _ in range(5):
    x = engine.step(x)        # one step each (its nested call of inner is not another)
print("done", x, looplib.Engine.sample(3))
