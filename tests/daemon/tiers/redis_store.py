#!/usr/bin/python3
"""A real Redis Cluster for the remote tier's tests: redis-server shards
(Debian's redis-server) joined by `redis-cli --cluster create`.

As a module:
    store = RedisStore(dir, shards=3, password="pw")
    store.start()            # waits for cluster_state:ok on every shard
    store.addrs              # ["127.0.0.1:PORT", ...]
    store.kill(1)            # a shard dies
    store.stop()

As a ctest fixture (FIXTURES_SETUP / FIXTURES_CLEANUP):
    redis_store.py start DIR   # writes DIR/addrs (one HOST:PORT per line)
                               # and DIR/password (mode 600); and a TLS
                               # server without cluster mode: DIR/tls_addr,
                               # DIR/ca.crt (its CA), DIR/other-ca.crt; and a
                               # TLS cluster: DIR/tls_cluster_addrs
    redis_store.py stop DIR

`prefix` runs every command under another (e.g. "ip netns exec NS"), and
`host` is the address the shards bind and announce.
"""
import os
import shutil
import socket
import subprocess
import sys
import time

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


def free_ports(n, host="127.0.0.1"):
    """n ports free on `host` whose cluster-bus port (+10000) is free too."""
    out = []
    while len(out) < n:
        with socket.socket() as s:
            s.bind((host, 0))
            p = s.getsockname()[1]
        if p > 55000 or p in out:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, p + 10000))
            except OSError:
                continue
        out.append(p)
    return out


class RedisStore:
    def __init__(self, dir, shards=3, password=None, host="127.0.0.1",
                 prefix=(), ports=None, maxmemory="256mb", tls_dir=None):
        self.dir = dir
        self.shards = shards
        self.password = password
        self.host = host
        self.prefix = list(prefix)
        self.ports = ports
        self.maxmemory = maxmemory
        # With tls_dir (make_certs' files): TLS only, the cluster bus too.
        self.tls_dir = tls_dir
        self.procs = {}

    def _tls_cli(self):
        if not self.tls_dir:
            return []
        return ["--tls", "--cacert", os.path.join(self.tls_dir, "ca.crt")]

    @property
    def addrs(self):
        return ["%s:%d" % (self.host, p) for p in self.ports]

    def _cli(self, port, *args, check=True, timeout=30):
        cmd = self.prefix + [REDIS_CLI, *self._tls_cli(), "-h", self.host,
                             "-p", str(port)]
        env = dict(os.environ)
        if self.password:
            env["REDISCLI_AUTH"] = self.password
        r = subprocess.run(cmd + list(args), capture_output=True, text=True,
                           timeout=timeout, env=env)
        if check and r.returncode != 0:
            raise RuntimeError("redis-cli %s: %s%s" % (" ".join(args), r.stdout,
                                                       r.stderr))
        return r.stdout

    def start_shard(self, port):
        conf = os.path.join(self.dir, "nodes-%d.conf" % port)
        if self.tls_dir:
            t = self.tls_dir
            listen = ["--port", "0", "--tls-port", str(port), "--tls-cluster",
                      "yes", "--tls-cert-file", os.path.join(t, "server.crt"),
                      "--tls-key-file", os.path.join(t, "server.key"),
                      "--tls-ca-cert-file", os.path.join(t, "ca.crt"),
                      "--tls-auth-clients", "no"]
        else:
            listen = ["--port", str(port)]
        args = [REDIS_SERVER, *listen, "--bind", self.host,
                "--cluster-enabled", "yes", "--cluster-config-file", conf,
                "--cluster-node-timeout", "2000", "--dir", self.dir,
                "--save", "", "--appendonly", "no", "--protected-mode", "no",
                "--maxmemory", self.maxmemory, "--maxmemory-policy", "allkeys-lru",
                "--logfile", os.path.join(self.dir, "redis-%d.log" % port)]
        if self.password:
            args += ["--requirepass", self.password, "--masterauth",
                     self.password]
        self.procs[port] = subprocess.Popen(self.prefix + args,
                                            stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL)
        deadline = time.time() + 20
        while time.time() < deadline:
            r = subprocess.run(
                self.prefix + [REDIS_CLI, *self._tls_cli(), "-h", self.host,
                               "-p", str(port), "PING"],
                capture_output=True, text=True,
                env=dict(os.environ, REDISCLI_AUTH=self.password or ""))
            if "PONG" in r.stdout or "NOAUTH" in r.stdout:
                return
            if self.procs[port].poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError("redis-server on port %d did not start (see %s)" %
                           (port, os.path.join(self.dir, "redis-%d.log" % port)))

    def start(self):
        os.makedirs(self.dir, exist_ok=True)
        if self.ports is None:
            self.ports = free_ports(self.shards, self.host)
        for p in self.ports:
            self.start_shard(p)
        self._cli(self.ports[0], "--cluster", "create", *self.addrs,
                  "--cluster-replicas", "0", "--cluster-yes", timeout=60)
        self.wait_ok(self.ports)
        return self

    def wait_ok(self, ports, timeout=30):
        deadline = time.time() + timeout
        for p in ports:
            while "cluster_state:ok" not in self._cli(p, "CLUSTER", "INFO",
                                                      check=False):
                if time.time() > deadline:
                    raise RuntimeError("cluster not ok on port %d" % p)
                time.sleep(0.1)

    def cli(self, shard, *args):
        return self._cli(self.ports[shard], *args)

    def dbsize(self):
        return sum(int(self.cli(i, "DBSIZE").strip() or 0)
                   for i, p in enumerate(self.ports) if p in self.procs)

    def keys(self, pattern="*"):
        out = []
        for i, p in enumerate(self.ports):
            if p in self.procs:
                out += [k for k in self.cli(i, "--scan", "--pattern",
                                            pattern).split() if k]
        return out

    def kill(self, shard):
        p = self.ports[shard]
        proc = self.procs.pop(p)
        proc.kill()
        proc.wait()

    def stop(self):
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs = {}


def make_certs(d, host="127.0.0.1"):
    """A CA, a server certificate for `host` signed by it, and a second CA
    that signed nothing (for a store that must not be trusted)."""
    def ssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)
    for ca in ("ca", "other-ca"):
        ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", "/CN=radixkv test " + ca, "-keyout", ca + ".key",
            "-out", ca + ".crt")
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=" + host,
        "-keyout", "server.key", "-out", "server.csr")
    with open(os.path.join(d, "ext"), "w") as f:
        f.write("subjectAltName=IP:%s,DNS:localhost\n" % host)
    ssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey",
        "ca.key", "-CAcreateserial", "-days", "2", "-extfile", "ext",
        "-out", "server.crt")


def start_tls_server(d, host="127.0.0.1"):
    """One redis-server without cluster mode, TLS only, on a free port."""
    make_certs(d, host)
    port = free_ports(1, host)[0]
    proc = subprocess.Popen(
        [REDIS_SERVER, "--port", "0", "--tls-port", str(port), "--bind", host,
         "--tls-cert-file", os.path.join(d, "server.crt"),
         "--tls-key-file", os.path.join(d, "server.key"),
         "--tls-ca-cert-file", os.path.join(d, "ca.crt"),
         "--tls-auth-clients", "no", "--save", "", "--appendonly", "no",
         "--dir", d, "--logfile", os.path.join(d, "redis-tls.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 20
    while time.time() < deadline:
        r = subprocess.run([REDIS_CLI, "--tls", "--cacert",
                            os.path.join(d, "ca.crt"), "-h", host, "-p",
                            str(port), "PING"], capture_output=True, text=True)
        if "PONG" in r.stdout:
            return proc, "%s:%d" % (host, port)
        time.sleep(0.05)
    raise RuntimeError("the TLS redis-server did not start")


def main(argv):
    if len(argv) != 3 or argv[1] not in ("start", "stop"):
        sys.stderr.write("usage: redis_store.py start|stop DIR\n")
        return 2
    d = argv[2]
    if argv[1] == "start":
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        store = RedisStore(d, shards=3, password="radixkv-test-pw",
                           maxmemory=os.environ.get("RADIXKV_STORE_MAXMEMORY",
                                                    "256mb")).start()
        # The fixture outlives this process: the shards must not be its
        # children's (they would die with the session); record their pids.
        with open(os.path.join(d, "addrs"), "w") as f:
            f.write("\n".join(store.addrs) + "\n")
        pw = os.path.join(d, "password")
        with open(pw, "w") as f:
            f.write(store.password + "\n")
        os.chmod(pw, 0o600)
        tls, tls_addr = start_tls_server(d)
        with open(os.path.join(d, "tls_addr"), "w") as f:
            f.write(tls_addr + "\n")
        # And a TLS cluster (its shards and bus TLS only), same CA.
        tls_cluster = RedisStore(os.path.join(d, "tls-cluster"), shards=3,
                                 password=store.password, tls_dir=d).start()
        with open(os.path.join(d, "tls_cluster_addrs"), "w") as f:
            f.write("\n".join(tls_cluster.addrs) + "\n")
        with open(os.path.join(d, "pids"), "w") as f:
            f.write("\n".join(str(p.pid) for p in
                              list(store.procs.values()) + [tls] +
                              list(tls_cluster.procs.values())) + "\n")
        return 0
    try:
        with open(os.path.join(d, "pids")) as f:
            for line in f:
                if line.strip():
                    try:
                        os.kill(int(line), 15)
                    except ProcessLookupError:
                        pass
    except FileNotFoundError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
