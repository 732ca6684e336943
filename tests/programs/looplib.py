"""A tiny engine of the kind a program's own decode loop lives in (for --step-function)."""
import time


def prefill_step(n):
    time.sleep(0.01)
    return n


class Engine:
    def step(self, x):
        time.sleep(0.005)
        return self.inner(x) + 1

    def inner(self, x):
        return x

    @staticmethod
    def sample(x):
        return x
