"""Our processes' commands (`python -m pipeline.cli ...`, the compiled pipeline's
`python -m pipeline.task_entrypoint ...`) run in children forked from one process that has
already imported what they import, instead of each in a new interpreter.

A pipeline task or a `tfrp run` spends much of its process on imports: TFX, TensorFlow and
Beam, 7,000 modules and more, 4 to 6 CPU-s on 2 cores, against a second or two for the work
of a 1,500-row task. The parent imports the command's entry module as the command's own
process does (its first lines install the process's exit handler and put off
`tfx.components`' `__init__`, before anything else is imported), then the modules the
commands import, without running anything: TensorFlow's runtime, Beam's workers and every
thread a command starts begin in the child. A child takes the caller's environment and
folder, runs the module as `python -m` does, with the command's arguments, its output going
to files (the caller gets them back in a `CompletedProcess`), and ends as the command's
process ends (threads joined, exit handlers, then `pipeline/process_exit.py`'s status).

What this leaves out is an interpreter's start, and so the environment variables libraries
read when they are imported are the parent's: a caller keeps a parent for each environment
its commands run with (tests/conftest.py's `tfrp`). Tests about a process's start (what a
command imports, a user's shell, the image's tasks) start their own processes.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Optional

PARENT = r"""
import atexit, importlib, json, os, runpy, sys, tempfile, threading, traceback
module, warm = json.loads(sys.argv[1])
for name in warm:
    importlib.import_module(name)
replies = os.fdopen(os.dup(1), "w")
children = {}
for line in sys.stdin:
    request = json.loads(line)
    if "wait" in request:
        _, wait_status = os.waitpid(children.pop(request["wait"]), 0)
        replies.write(json.dumps({"status": os.waitstatus_to_exitcode(wait_status)}) + "\n")
        replies.flush()
        continue
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid:
        children[request["id"]] = pid
        continue
    status = 1
    try:
        replies.close()
        written = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], written),
                                (2, request["stderr"], written)):
            opened = os.open(path, flags, 0o644)
            os.dup2(opened, fd)
            os.close(opened)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # found again from TMPDIR
        sys.argv = [module, *request["args"]]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)  # as `python -m`
        except SystemExit as finished:
            code = finished.code
            status = 0 if code is None else code if isinstance(code, int) else 1
            if isinstance(code, str):
                print(code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        threading._shutdown()
        atexit._run_exitfuncs()  # the last one, process_exit's, ends the child
    finally:
        os._exit(status)
"""


class ForkServer:
    """Runs `python -W ignore -m MODULE ARGS` in forked children: `warm` are the modules the
    parent imports first, in order (the entry module's own first: the imports its process
    makes before any other). The parent starts with `env`."""

    def __init__(self, module: str, warm: list[str], env: dict):
        self._parent = subprocess.Popen(
            [sys.executable, "-W", "ignore", "-c", PARENT, json.dumps([module, warm])],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._outputs = tempfile.mkdtemp(prefix="forked-output-")
        self._started = 0
        self._args: dict[int, list[str]] = {}  # of the commands not yet waited for

    def start(self, args: list[str], env: dict, cwd: Optional[str] = None) -> int:
        """Starts the command with `args`; an id for `wait`."""
        self._started += 1
        started = self._started
        self._args[started] = list(args)
        self._send({"id": started, "args": list(args), "stdout": self._output(started, "out"),
                    "stderr": self._output(started, "err"), "env": env,
                    "cwd": cwd or os.getcwd()})
        return started

    def wait(self, started: int) -> subprocess.CompletedProcess:
        """What the command `start` gave this id printed, and its exit status."""
        self._send({"wait": started})
        reply = self._parent.stdout.readline()
        if not reply:
            raise RuntimeError(f"the commands' parent process ended ({self._parent.wait()})")
        stdout, stderr = (self._read_output(started, stream) for stream in ("out", "err"))
        return subprocess.CompletedProcess(self._args.pop(started), json.loads(reply)["status"],
                                           stdout, stderr)

    def run(self, args: list[str], env: dict,
            cwd: Optional[str] = None) -> subprocess.CompletedProcess:
        return self.wait(self.start(args, env, cwd))

    def _output(self, started: int, stream: str) -> str:
        return os.path.join(self._outputs, f"{started}.{stream}")

    def _read_output(self, started: int, stream: str) -> str:
        path = self._output(started, stream)
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        os.remove(path)
        return text

    def _send(self, request: dict) -> None:
        self._parent.stdin.write(json.dumps(request) + "\n")
        self._parent.stdin.flush()

    def close(self) -> None:
        self._parent.stdin.close()
        self._parent.wait(timeout=60)
        shutil.rmtree(self._outputs, ignore_errors=True)
