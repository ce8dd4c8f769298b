"""The main job, end to end, with the real `kith` command (run it via `scripts/demo`).

1. a community server on 127.0.0.1 (its own home),
2. a Host home: `kith init`, `kith index add <corpus>`, `kith index sync`,
   `kith policy set '/<root>/**' public`, then `kith host --server URL --offline --json`,
3. a Guest home: `kith init`, `kith join <post_id> --server URL --offline --trust --query ...`,
   which prints cited answers,
4. everything is stopped (SIGINT) and the workspace removed (unless --keep).

Every command is printed before it runs. Exit status 0 only if every step worked and every
question got an `ok` answer. Bounded: each step has a timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = REPO / "demo" / "corpus" / "python-docs-sample"
QUESTIONS = [
    "how do I make a temporary directory that is deleted automatically",
    "how can I run a shell command and capture its output",
    "store data in a local database file with transactions",
    "generate a secure random token for a password reset link",
]
KITH = [sys.executable, "-m", "node.cli.main"]


def _bold_ok() -> bool:
    """Bold step titles only on a terminal that can show them (never into a pipe or a
    file, never with NO_COLOR set or TERM=dumb)."""
    return (sys.stdout.isatty() and not os.environ.get("NO_COLOR")
            and os.environ.get("TERM", "") != "dumb")


def say(text: str) -> None:
    if _bold_ok():
        print(f"\n\033[1m== {text}\033[0m", flush=True)
    else:
        print(f"\n== {text}", flush=True)


def show(cmd: list[str]) -> None:
    shown = ["kith"] + cmd[len(KITH):] if cmd[:len(KITH)] == KITH else cmd
    print("$ " + " ".join(shlex.quote(c) for c in shown), flush=True)


def run(cmd: list[str], *, timeout: float = 300, capture: bool = False) -> subprocess.CompletedProcess:
    show(cmd)
    proc = subprocess.run(cmd, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE if capture else None)
    if proc.returncode != 0:
        raise SystemExit(f"demo: step failed with exit status {proc.returncode}")
    return proc


class Background:
    """A long-running `kith` process whose first stdout line is a JSON object."""

    def __init__(self, cmd: list[str], timeout: float = 60) -> None:
        show(cmd + ["&"])
        self.proc = subprocess.Popen(cmd, text=True, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.stop()
            raise SystemExit(f"demo: `{' '.join(cmd[len(KITH):])}` did not start")
        self.first = json.loads(line)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="folder to share (default: bundled Python-docs sample)")
    parser.add_argument("--query", "-q", action="append", help="question to ask (repeatable; default: four built-in questions)")
    parser.add_argument("--keep", action="store_true", help="keep the demo workspace (homes, invitation) afterwards")
    args = parser.parse_args()
    corpus = args.corpus.resolve()
    if not corpus.is_dir():
        parser.error(f"corpus folder {corpus} does not exist")
    questions = args.query or QUESTIONS

    workspace = Path(tempfile.mkdtemp(prefix="kith-demo-"))
    server_home, host_home, guest_home = workspace / "community", workspace / "host", workspace / "guest"
    procs: list[Background] = []
    started = time.monotonic()
    try:
        say("1. community server on 127.0.0.1 (helps peers find each other; never sees a query)")
        server = Background([*KITH, "--home", str(server_home), "community", "serve", "--port", "0", "--json"])
        procs.append(server)
        url = server.first["url"]

        say(f"2. Host: index {corpus.name} and share it")
        run([*KITH, "--home", str(host_home), "init"])
        run([*KITH, "--home", str(host_home), "index", "add", str(corpus)])
        run([*KITH, "--home", str(host_home), "index", "sync"], timeout=900)
        run([*KITH, "--home", str(host_home), "policy", "set", f"/{corpus.name}/**", "public"])
        host = Background([*KITH, "--home", str(host_home), "host", "--server", url, "--offline", "--json"])
        procs.append(host)
        post_id = host.first["post_id"]
        print(f"   published invitation post_id={post_id} (host key {host.first['host_public_key'][:16]}…)")

        say("3. Guest: join by post_id over iroh and ask")
        run([*KITH, "--home", str(guest_home), "init"])
        cmd = [*KITH, "--home", str(guest_home), "join", post_id, "--server", url, "--offline", "--trust"]
        for q in questions:
            cmd += ["--query", q]
        run(cmd + ["--top-k", "3"], timeout=120)

        say("4. the same questions as JSON (what an agent reads): status and top source per answer")
        out = run(cmd + ["--top-k", "3", "--json"], timeout=120, capture=True).stdout
        answers = [json.loads(line) for line in out.splitlines() if line.strip()]
        failed = 0
        for msg in answers:
            results = msg["envelope"]["results"]
            top = results[0]["source"] if results else "-"
            print(f"   {msg['query_id']}: {msg['status']:<20} {top}")
            failed += msg["status"] != "ok"
        if len(answers) != len(questions) or failed:
            print("demo: some questions got no answer", file=sys.stderr)
            return 1
    finally:
        say("5. stopping")
        for p in reversed(procs):
            code = p.stop()
            print(f"   stopped {' '.join(p.proc.args[len(KITH) + 2:len(KITH) + 4])} (exit {code})")
        if args.keep:
            print(f"   workspace kept in {workspace}")
        else:
            import shutil

            shutil.rmtree(workspace, ignore_errors=True)
    print(f"\ndemo finished in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
