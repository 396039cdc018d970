"""A time limit for one benchmark step on a GPU.

A kernel that never finishes blocks its process in a CUDA synchronization, and the run then
waits until something outside kills it (a candidate build that deadlocks only in long runs does
exactly this). `guard(seconds, what)` ends the process instead once the step has run that long,
after printing every thread's Python traceback. The traceback comes from faulthandler, whose
watchdog is a C thread, so it fires even while the main thread holds the GIL; `what` is printed
by a Python timer a little earlier, when the GIL is free (a thread waiting inside CUDA or ctypes
has released it).
"""

import contextlib
import faulthandler
import sys
import threading


@contextlib.contextmanager
def guard(seconds, what=""):
    """Runs the body with a time limit: past `seconds` the process exits (status 1), printing
    `what` and the tracebacks to stderr. Steps do not nest (faulthandler keeps one limit)."""
    timer = None
    if what:
        timer = threading.Timer(max(0.0, seconds - 0.2), lambda: print(
            f"hang_guard: '{what}' is reaching its {seconds:g} s limit", file=sys.stderr,
            flush=True))
        timer.daemon = True
        timer.start()
    faulthandler.dump_traceback_later(seconds, exit=True, file=sys.stderr)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        if timer is not None:
            timer.cancel()
