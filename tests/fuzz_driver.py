"""Run many fuzz cases of the `pipesched` command in this one process (started by
``fuzz_inputs.run_cases`` with a memory limit), each in a fresh folder with its input files,
stopped by an alarm after a time limit. Process start-up is paid once per batch instead of
once per case.

    python fuzz_driver.py CASES.json RESULTS.jsonl TIMEOUT_S

Before each case the driver writes ``{"started": i}`` to RESULTS, after it the outcome:
exit code, the start of stdout and stderr, the seconds taken, the files the folder held
afterwards, whether the inputs were left untouched, and "raised" (an exception that
escaped the command, with its traceback), "timeout" or "memory". After a timeout or a
memory error the process may be in a bad state, so the driver stops there; the parent
starts a new one for the remaining cases, and kills one that stops answering.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path


class _Timeout(BaseException):
    """The alarm: the case ran past its time limit (a BaseException, like Ctrl-C, so the
    command cannot swallow it)."""


def _alarm(signum, _frame):
    raise _Timeout


def run_case(case: dict, timeout_s: float) -> dict:
    from pipesched.cli import main

    folder = Path(tempfile.mkdtemp(prefix="pipesched-fuzz-"))
    here = os.getcwd()
    inputs = {name: base64.b64decode(data) for name, data in case["files"].items()}
    for name, data in inputs.items():
        (folder / name).write_bytes(data)
    out, err = io.StringIO(), io.StringIO()
    outcome: dict = {"code": None}
    began = time.monotonic()
    os.chdir(folder)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(list(case["argv"]))
        outcome["code"] = 0
    except SystemExit as exc:
        outcome["code"] = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except _Timeout:
        outcome["timeout"] = True
    except MemoryError:
        outcome["memory"] = True
    except BaseException:
        outcome["raised"] = traceback.format_exc()[-3000:]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        os.chdir(here)
    outcome["seconds"] = time.monotonic() - began
    text_out, text_err = out.getvalue(), err.getvalue()
    outcome.update(out=text_out[:2000], out_bytes=len(text_out), err=text_err[:3000], err_lines=len(text_err.splitlines()))
    present = sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())
    outcome["files"] = present
    outcome["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # the process so far
    outcome["inputs_intact"] = all((folder / name).is_file() and (folder / name).read_bytes() == data
                                   for name, data in inputs.items())
    shutil.rmtree(folder, ignore_errors=True)
    return outcome


def main(argv: list[str]) -> None:
    cases_path, results_path, timeout_s = argv[0], argv[1], float(argv[2])
    cases = json.loads(Path(cases_path).read_text(encoding="utf-8"))
    signal.signal(signal.SIGALRM, _alarm)
    with open(results_path, "a", encoding="utf-8") as results:
        for index, case in enumerate(cases):
            results.write(json.dumps({"started": index}) + "\n")
            results.flush()
            outcome = run_case(case, timeout_s)
            results.write(json.dumps({"index": index, **outcome}) + "\n")
            results.flush()
            if outcome.get("timeout") or outcome.get("memory"):
                return  # this process may be in a bad state: the parent starts a fresh one


if __name__ == "__main__":
    main(sys.argv[1:])
