"""How far a long command is: the time it has run and, at its pace so far, the time it has left, said in a training
run's step line and an evaluation's log; and where the output is a terminal, a progress bar beside them."""

import sys

from transformers.trainer_callback import ProgressCallback


def duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def time_left(elapsed_s: float, done: int, total: int) -> str:
    """ "5m 10s elapsed, about 20m 40s left": what is left of `total` at the pace of the `done` so far."""
    if done <= 0 or done >= total:
        return f"{duration(elapsed_s)} elapsed"
    return f"{duration(elapsed_s)} elapsed, about {duration(elapsed_s / done * (total - done))} left"


def on_a_terminal() -> bool:
    return sys.stderr.isatty()


class TerminalProgress(ProgressCallback):
    """transformers' progress bar of the steps, without its printing of every logged figure (the step line says
    what is worth reading)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        pass
