"""radixkv.integrations.transformers with the model on a CUDA device (label:
needs a GPU; skipped with the reason printed where torch sees none).

Two worker processes (_hf_util.py --device cuda) share one radixkvd, once
with a cuda pool (pages in device memory, mapped into each worker through
CUDA VMM handles: copies device to device) and once with a host pool
(copies between pinned-or-pageable host pages and the device). The second
process loads the first one's blocks; its next-token logits equal a full
prefill within 1e-4 (fp32), its greedy tokens equal model.generate's, and
the daemon ends with no lease and no page being written.
"""
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

import _hf_util  # noqa: E402
from rkv_testutil import Daemon, assert_no_leaks  # noqa: E402
from test_transformers import TOL, prompt, run_worker  # noqa: E402

# A skip per test, not per module: pytest exits 5 when a module-level skip
# leaves nothing collected.
pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="torch sees no CUDA device: the model-on-GPU checks need one")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return _hf_util.build_model(str(tmp_path_factory.mktemp("llama") / "tiny-llama"))


@pytest.mark.parametrize("pool", ["cuda,device=0,bytes=64MiB", "host,bytes=16MiB"])
def test_model_on_gpu_loads_another_process_blocks(tmp_path, model_dir, pool):
    radixkvd = os.environ.get("RADIXKVD")
    if not radixkvd:
        pytest.skip("$RADIXKVD (the radixkvd binary) is not set")
    d = Daemon(radixkvd, [], pool).start()
    try:
        a = prompt(1, 100)                       # 6 full blocks + 4 tokens
        first = run_worker(tmp_path, "gpu-first", model_dir, d.sock, [a],
                           device="cuda")
        assert (first[0]["cached"], first[0]["saved"]) == (0, 6)
        second = run_worker(tmp_path, "gpu-second", model_dir, d.sock, [a],
                            device="cuda")
        hit = second[0]
        assert (hit["cached"], hit["saved"]) == (96, 0)
        diff = (hit["logits"] - hit["ref_logits"]).abs().max().item()
        assert diff <= TOL, f"logits differ from a full prefill by {diff}"
        diff = (hit["logits"] - first[0]["ref_logits"]).abs().max().item()
        assert diff <= TOL, f"logits differ from the first process's prefill by {diff}"
        assert torch.equal(hit["gen"], hit["ref_gen"]), (hit["gen"], hit["ref_gen"])
        s = assert_no_leaks(d)
        assert s.inserted_blocks == 6, s
    finally:
        d.cleanup()
