"""The in-sandbox side of a persistent shell (envs.sandbox.shell): started by envs.sandbox.shell.runner_argv.

Stdlib only, Python 3.6+ syntax (it runs under a task image's python3). It reads requests on
stdin and answers on stdout, both of which it moves to descriptors no command inherits; every
command is a child in a new session with stdin from /dev/null (or a pipe of the request's
bytes), its output to fresh pipes, every other descriptor closed. It first makes itself
non-dumpable, so a command of the same uid can neither open /proc/<runner>/fd/* (the control
pipes), read its memory or environment, nor ptrace it. The channel's first 16 bytes are a
secret token that starts every answer.

Request: b"Q" + 4-byte big-endian length + JSON header + `stdin` bytes (header "stdin": count,
or -1 for /dev/null). Header: argv, env, cwd, timeout (s), head, tail (bytes of stdout kept from
the start and the end), cap (kill once stdout passes it; null: never), merge (stderr into
stdout), inherit_env (env on top of the runner's own environment), files ({path: text} written
before, removed after), marker ("NAME=value": processes holding it are killed at timeout), ack.
Accepted (when the header says "ack"): token + ff ff ff ff, once the request is read (before
the command starts).
Answer: token + 4-byte length + JSON {code, timed_out, total, head, tail, err, left} + the
head, tail and stderr bytes (`left`: processes that would not die).

MODE "ns" (pid 1 of the sandbox's own pid namespace): after every command, and at its
timeout, everything else in the namespace is killed (kill(-1)); signals from commands do not
reach pid 1. MODE "marker": at a timeout the command's process group and every process holding
its marker are killed; background processes otherwise live on.
"""

import contextlib
import errno
import json
import os
import select
import signal
import struct
import subprocess
import sys
import time

ACCEPTED = b"\xff\xff\xff\xff"  # in place of an answer's length: the request was read
RUNNING = [None]  # the pid of the command being run (an error then kills it and says so)
DRAIN_S = 0.05  # after the command exits, how long its children may still fill the pipe


def read_exact(fd, n):
    chunks = []
    while n:
        data = os.read(fd, n)
        if not data:
            return None
        chunks.append(data)
        n -= len(data)
    return b"".join(chunks)


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def non_dumpable():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0)")


def reap(child, status):
    """Reap every exited child (orphans too, as pid 1); the command's status lands in status[0]."""
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == child:
            status[0] = st


def kill_others(child, status, deadline_s=2.0):
    """kill(-1) until nothing but this process is left in the namespace; returns how many stayed."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return 0
        reap(child, status)
        if time.monotonic() > end:
            return sum(1 for p in os.listdir("/proc") if p.isdigit() and p != "1")
        time.sleep(0.001)


def environ_and_state(pid):
    """`pid`'s environment block and its state letter; (None, None) once it is gone."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            block = f.read()
        with open(f"/proc/{pid}/stat", "rb") as f:
            return block, f.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return None, None


def pids_holding(needle, me):
    """The processes whose environment holds `needle`. A live process caught inside execve reads empty
    for a moment (its new image has no environment yet): the scan's empty reads are read again
    together, 5 ms apart, at most 20 times in all."""
    read = {int(p): environ_and_state(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me}
    empty = [p for p, (block, state) in read.items() if block == b"" and state != b"Z"]
    for _ in range(20):
        if not empty:
            break
        time.sleep(0.005)
        read.update((p, environ_and_state(p)) for p in empty)
        empty = [p for p in empty if read[p][0] == b"" and read[p][1] != b"Z"]
    return [p for p, (block, _) in read.items() if block and needle in block.split(b"\0")]


def kill_marked(marker, me):
    needle = marker.encode()
    for _ in range(20):
        found = pids_holding(needle, me)
        if not found:
            return
        for p in found:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        time.sleep(0.01)


def run(req, stdin, mode, wake_r):
    head_max, tail_max, cap = req["head"], req["tail"], req.get("cap")
    head, tail, err = bytearray(), bytearray(), bytearray()
    total = [0]
    written = []
    for path, text in (req.get("files") or {}).items():  # a fresh file: no planted link or FIFO
        with contextlib.suppress(OSError):
            os.unlink(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(text)
        written.append(path)
    out_r, out_w = os.pipe()
    err_r, err_w = (None, None) if req.get("merge") else os.pipe()
    in_r, in_w = (None, None) if stdin is None else os.pipe()
    env = req["env"]
    if req.get("inherit_env"):  # on top of the runner's own (a container's image ENV: PATH, ...)
        env = dict(os.environ, **env)
    try:
        proc = subprocess.Popen(
            req["argv"], env=env, cwd=req.get("cwd"), close_fds=True, start_new_session=True,
            stdin=subprocess.DEVNULL if in_r is None else in_r, stdout=out_w,
            stderr=subprocess.STDOUT if err_w is None else err_w,
        )  # fmt: skip
    except OSError as e:
        for fd in (out_r, out_w, err_r, err_w, in_r, in_w):
            if fd is not None:
                os.close(fd)
        msg = f"bash: {e}\n".encode()
        return {"code": 127, "timed_out": False, "total": len(msg), "left": 0}, msg, b"", b""
    child, status = proc.pid, [None]
    RUNNING[0] = child
    for fd in (out_w, err_w, in_r):
        if fd is not None:
            os.close(fd)
    readers = {out_r: "out"}
    if err_r is not None:
        readers[err_r] = "err"
    pending = memoryview(stdin) if stdin is not None else None
    if in_w is not None:
        os.set_blocking(in_w, False)
        if not pending:
            os.close(in_w)
            in_w = None
    deadline = time.monotonic() + req["timeout"]
    timed_out, exited_at, left = False, None, 0

    def kill():
        with contextlib.suppress(OSError):
            os.killpg(child, signal.SIGKILL)
        if mode == "ns":
            return kill_others(child, status)
        if req.get("marker"):
            kill_marked(req["marker"], os.getpid())
        return 0

    while True:
        reap(child, status)
        now = time.monotonic()
        if exited_at is None and status[0] is not None:
            exited_at = now
            if mode == "ns":
                left = kill_others(child, status)
        if exited_at is not None and (not readers or now - exited_at > DRAIN_S):
            break
        if exited_at is None and (now >= deadline or (cap is not None and total[0] > cap)):
            timed_out = now >= deadline
            left = kill()
            while status[0] is None:  # the killed command is reaped at once
                reap(child, status)
                if status[0] is None:
                    time.sleep(0.001)
            continue
        wait = DRAIN_S if exited_at is not None else min(deadline - now, 1.0)
        writers = [in_w] if in_w is not None else []
        try:
            ready_r, ready_w, _ = select.select(list(readers) + [wake_r], writers, [], max(wait, 0.0))
        except InterruptedError:
            continue
        if wake_r in ready_r:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
        if ready_w:
            try:
                pending = pending[os.write(in_w, pending) :]
            except BlockingIOError:
                pass
            except OSError:  # the command closed its stdin
                pending = pending[:0]
            if not pending:
                os.close(in_w)
                in_w = None
        for fd in ready_r:
            if fd not in readers:
                continue
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            if not data:
                os.close(fd)
                del readers[fd]
                continue
            if readers[fd] == "err":
                if len(err) < 4096:
                    err += data[: 4096 - len(err)]
                continue
            total[0] += len(data)
            room = head_max - len(head)
            if room > 0:
                head += data[:room]
                data = data[room:]
            if data and tail_max:
                tail += data
                if len(tail) > tail_max:
                    del tail[: len(tail) - tail_max]
    for fd in list(readers) + ([in_w] if in_w is not None else []):
        os.close(fd)
    proc.returncode = 0  # reaped here; keeps subprocess from waiting on it again
    RUNNING[0] = None
    st = status[0]
    code = os.WEXITSTATUS(st) if os.WIFEXITED(st) else 128 + os.WTERMSIG(st)
    for path in written:
        with contextlib.suppress(OSError):
            os.unlink(path)
    header = {"code": code, "timed_out": timed_out, "total": total[0], "left": left}
    return header, bytes(head), bytes(tail), bytes(err)


def main():
    mode = sys.argv[-1]
    if mode == "ns" and os.getpid() != 1:  # kill(-1) is only safe inside a pid namespace of its own
        sys.exit(2)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # pid 1 then ignores it from commands
    ctl_in, ctl_out = os.dup(0), os.dup(1)  # not inheritable
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    non_dumpable()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    token = read_exact(ctl_in, 16)
    if token is None:
        return
    write_all(ctl_out, token + struct.pack(">I", os.getpid()))
    while True:
        kind = read_exact(ctl_in, 5)
        if kind is None or kind[:1] != b"Q":
            return
        req = json.loads(
            read_exact(ctl_in, struct.unpack(">I", kind[1:])[0]).decode("utf-8", "surrogatepass")
        )
        stdin = None if req["stdin"] < 0 else read_exact(ctl_in, req["stdin"])
        if req.get("ack"):  # the host now knows this command may have run
            write_all(ctl_out, token + ACCEPTED)
        try:
            header, head, tail, err = run(req, stdin, mode, wake_r)
        except Exception as e:  # report, never die: the host falls back for this request
            started, RUNNING[0] = RUNNING[0], None
            if started is not None:  # it ran: kill what it started; the host must not run it again
                with contextlib.suppress(OSError):
                    os.killpg(started, signal.SIGKILL)
                if mode == "ns":
                    kill_others(started, [None])
                elif req.get("marker"):
                    kill_marked(req["marker"], os.getpid())
            error = {"error": f"runner: {e!r}", "started": started is not None, "code": -1}
            header, head, tail, err = error, b"", b"", b""
        header.update(nhead=len(head), ntail=len(tail), nerr=len(err))
        body = json.dumps(header).encode()
        write_all(ctl_out, token + struct.pack(">I", len(body)) + body + head + tail + err)


if __name__ == "__main__":
    try:
        main()
    except OSError as e:
        if e.errno != errno.EPIPE:
            raise
