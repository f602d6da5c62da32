"""The reference worker (radixkv-worker) for the tier tests: run a prompt
file through a daemon, or without one (full prefills), and compare
answers bit for bit."""
import json
import subprocess

from rkv_testutil import executable


def run_worker(prompts, endpoint=None):
    """One JSON object per prompt of the file `prompts`; endpoint None:
    full prefills, no daemon."""
    args = [executable("RADIXKV_WORKER"), "run", "--prompts", prompts, "--json",
            "--decode", "4", "--device", "cpu"]
    args += ["--endpoint", endpoint] if endpoint else ["--no-cache"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def check_equal(got, reference):
    """Every answer's first-token logits and generated tokens equal the
    reference's."""
    assert len(got) == len(reference)
    for g, r in zip(got, reference):
        assert g["first_logits_xxh3"] == r["first_logits_xxh3"], (g, r)
        assert g["generated"] == r["generated"], (g, r)
