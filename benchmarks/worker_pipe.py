"""A benchmark's worker process spoken to through a pipe: the parent writes one command line, the worker answers one
JSON line (its first line, unasked, says it is ready). hook_path.py, version_step_cost.py and delivery_cost.py time
each checkout in such a worker."""
import json
import os
import subprocess


class Worker:
    def __init__(self, argv, env):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.info = self.ask(None)

    def ask(self, cmd):
        if cmd is not None:
            self.proc.stdin.write(cmd + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker ended: {self.proc.args}")
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def git_commit(path):
    """The short commit of the checkout at path (its path where it is no git checkout)."""
    out = subprocess.run(["git", "-C", path, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or os.path.abspath(path)
