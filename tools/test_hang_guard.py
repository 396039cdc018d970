"""tools/hang_guard.py: a step past its limit ends the process; one within it does not."""

import pathlib
import subprocess
import sys
import time

TOOLS = pathlib.Path(__file__).resolve().parent


def run(body, timeout=30):
    code = f"import sys, time; sys.path.insert(0, {str(TOOLS)!r}); import hang_guard\n{body}"
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout)
    return done, time.monotonic() - start


def test_a_step_past_its_limit_ends_the_process_with_its_traceback():
    done, took = run("with hang_guard.guard(0.5, 'sleeping row'):\n    time.sleep(20)\n"
                     "print('not reached')")
    assert done.returncode != 0
    assert took < 10
    assert "not reached" not in done.stdout
    assert "sleeping row" in done.stderr
    assert "Timeout" in done.stderr and "most recent call first" in done.stderr


def test_a_step_within_its_limit_and_the_steps_after_it_run_on():
    done, took = run("for i in range(3):\n"
                     "    with hang_guard.guard(2):\n        time.sleep(0.1)\n"
                     "time.sleep(2.5)\nprint('done')")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done"
    assert done.stderr == ""
