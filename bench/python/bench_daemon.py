"""A radixkvd child process for the Python benchmarks in this directory."""
import subprocess
import time


def start_daemon(radixkvd, sock, pool):
    """Starts radixkvd on `sock` with `pool` (its --pool) and no metrics;
    returns (process, log file) once it prints "ready". The log is
    sock + ".log". RuntimeError if it does not start within 30 s."""
    log = open(sock + ".log", "w")
    proc = subprocess.Popen([radixkvd, "--socket=" + sock, "--metrics_listen=",
                             "--pool=" + pool],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while time.time() < deadline:
        with open(sock + ".log") as f:
            if "radixkvd: ready" in f.read():
                return proc, log
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("radixkvd did not start; see " + sock + ".log")
