#!/usr/bin/env python3
"""Where a Redis lock's server time goes: the cost of each in-script call, tenure's own
acquire+release scripts batched and unbatched, and an rslock-style cycle (SET NX PX + a
compare-and-delete script), all from INFO commandstats (execution time only, no I/O).

Usage: python3 e2e/scripts/redis-script-costs.py   (needs redis-server on the PATH; starts
its own server on a free loopback port and stops it). No Python packages needed.
"""
import os, socket, subprocess, sys, tempfile, time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(REPO, "src", "backend", "redis")


def script(name):
    """A script's source as tenure loads it: value.lua (the layout test), then the file."""
    with open(os.path.join(SCRIPTS, "value.lua")) as shared, open(os.path.join(SCRIPTS, name)) as own:
        return shared.read() + own.read()


HOLDER = "0123456789abcdef0123456789abcdef"
REPS = 5


def enc(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.f = self.s.makefile("rb")

    def read(self):
        line = self.f.readline()
        kind, rest = line[:1], line[1:-2]
        if kind in (b"+", b":"):
            return rest
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.f.read(n + 2)[:-2]
        if kind == b"*":
            return [self.read() for _ in range(int(rest))]
        raise RuntimeError(line)

    def cmd(self, *a):
        self.s.sendall(enc(*a))
        return self.read()

    def pipe(self, cmds):
        self.s.sendall(b"".join(enc(*c) for c in cmds))
        return [self.read() for _ in cmds]

    def exec_usec(self, name):
        info = self.cmd("INFO", "commandstats").decode()
        for line in info.split("\r\n"):
            if line.startswith("cmdstat_%s:" % name):
                return float(line.split("usec=")[1].split(",")[0])
        return 0.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def per_entry(c, src, n_calls=300, batch=64):
    sha = c.cmd("SCRIPT", "LOAD", src)
    best = None
    for _ in range(REPS):
        c.cmd("FLUSHALL")
        c.cmd("CONFIG", "RESETSTAT")
        call = ["EVALSHA", sha, batch] + ["k{%d}" % i for i in range(batch)] + [HOLDER] * batch
        for j in range(0, n_calls, 10):
            c.pipe([call] * 10)
        us = c.exec_usec("evalsha") / (n_calls * batch)
        best = us if best is None else min(best, us)
    return best


def tenure_cycle(c, batch, n_calls):
    acq = c.cmd("SCRIPT", "LOAD", script("acquire.lua"))
    rel = c.cmd("SCRIPT", "LOAD", script("release.lua"))
    best = None
    for _ in range(REPS):
        c.cmd("FLUSHALL")
        c.cmd("CONFIG", "RESETSTAT")
        a = ["EVALSHA", acq, 2 * batch]
        for i in range(batch):
            a += ["tenure:{l%d}" % i, "tenure:{l%d}:fence" % i]
        for i in range(batch):
            a += [HOLDER, "bench", 30000]
        r = ["EVALSHA", rel, batch] + ["tenure:{l%d}" % i for i in range(batch)] + [5000, "0" * batch] + [HOLDER] * batch
        for _ in range(n_calls):
            c.pipe([a, r])
        us = c.exec_usec("evalsha") / (n_calls * batch)
        best = us if best is None else min(best, us)
    return best


def rslock_cycle(c, n=20000):
    unlock = "if redis.call('get',KEYS[1]) == ARGV[1] then return redis.call('del',KEYS[1]) else return 0 end"
    sha = c.cmd("SCRIPT", "LOAD", unlock)
    best = None
    for _ in range(REPS):
        c.cmd("FLUSHALL")
        c.cmd("CONFIG", "RESETSTAT")
        cmds = []
        for i in range(n):
            cmds.append(["SET", "rl{%d}" % (i % 64), HOLDER, "NX", "PX", 30000])
            cmds.append(["EVALSHA", sha, 1, "rl{%d}" % (i % 64), HOLDER])
        for j in range(0, len(cmds), 128):
            c.pipe(cmds[j:j + 128])
        us = (c.exec_usec("set") + c.exec_usec("evalsha")) / n
        best = us if best is None else min(best, us)
    return best


def main():
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="tenure-script-costs-")
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", tmp],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                c = Conn(port)
                c.cmd("PING")
                break
            except OSError:
                time.sleep(0.05)
        loop = "local out={} for i=1,#KEYS do %s out[i]=1 end return out"
        calls = {
            "loop, nothing else": "",
            "GET": "redis.call('GET',KEYS[i])",
            "INCR": "redis.call('INCR',KEYS[i]..':f')",
            "PUBLISH (no subscribers)": "redis.call('PUBLISH',KEYS[i],ARGV[i])",
            "SET": "redis.call('SET',KEYS[i],ARGV[i])",
            "SET ... PX": "redis.call('SET',KEYS[i],ARGV[i],'PX',30000)",
            "PEXPIRE": "redis.call('PEXPIRE',KEYS[i],30000)",
            "SETRANGE": "redis.call('SETRANGE',KEYS[i],'0','~')",
        }
        print("| in-script call (64 entries per EVALSHA) | µs per entry |\n|---|---|")
        for name, body in calls.items():
            print("| %s | %.2f |" % (name, per_entry(c, loop % body)))
        print("\n| cycle (acquire → release) | server µs per cycle, execution only |\n|---|---|")
        print("| tenure scripts, 64 locks per call | %.2f |" % tenure_cycle(c, 64, 200))
        print("| tenure scripts, 1 lock per call | %.2f |" % tenure_cycle(c, 1, 5000))
        print("| rslock-style: SET NX PX + compare-and-delete | %.2f |" % rslock_cycle(c))
        print("\n(minimum of %d runs; redis %s)" % (REPS, c.cmd("INFO", "server").decode().split("redis_version:")[1].split("\r\n")[0]))
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    sys.exit(main())
