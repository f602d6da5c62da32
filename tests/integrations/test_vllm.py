"""radixkv.integrations.vllm.RadixKVConnector against the installed vLLM's
own classes: KVConnectorFactory, VllmConfig/KVTransferConfig, the v1
Scheduler and Request (scheduler side), per-layer KV tensors from vLLM's
allocate_kv_cache in its KVCacheLayouts (worker side), and radixkvd child
processes with a host pool.

vLLM cannot execute a model on this CPU-only machine (the installed wheel
is the CUDA build; docs/integrations/vllm.md records the error), so an
"engine step" here is: Scheduler.schedule() -> the worker connector's
start_load_kv / wait_for_layer_load / save_kv_layer / wait_for_save, with
the attention's cache write replaced by deterministic random K/V written
into the scheduled blocks -> Scheduler.update_from_output().
"""
import json
import os
import pickle
import signal
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

torch = pytest.importorskip("torch", reason="torch is not installed")
vllm = pytest.importorskip("vllm", reason="vllm is not installed in this interpreter")
radixkv = pytest.importorskip("radixkv", reason="radixkv is not on PYTHONPATH "
                              "(PYTHONPATH=<build>/python)")

import _vllm_util as U  # noqa: E402

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

from radixkv.integrations import vllm as rv  # noqa: E402


@pytest.fixture
def daemons(daemon_factory):
    """daemon_factory (conftest.py): radixkvd children with a host pool."""
    return daemon_factory


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {"a": U.make_model(str(root / "tiny-llama-a"), seed=0),
            "b": U.make_model(str(root / "tiny-llama-b"), seed=1)}


def no_leaks(d, timeout=10.0):
    s = d.wait_stats(lambda s: s.leases == 0 and s.writing_pages == 0, timeout=timeout)
    assert (s.leases, s.writing_pages) == (0, 0), s
    assert s.invariants_ok, s
    return s


class Engine:
    """A scheduler (with its connector) and a worker connector over one set
    of per-layer KV tensors in `layout`."""

    def __init__(self, model, sock, layout="LBHNC", packing="head_blocks", **kw):
        extra = {"endpoint": sock, "kv_packing": packing, **kw.pop("extra", {})}
        self.vc = U.vllm_config(model, extra, **kw)
        self.kcc = U.kv_cache_config(self.vc, layout)
        self.caches = U.allocate(self.kcc, layout)
        self.packing = packing
        self.sched = U.scheduler(self.vc, self.kcc)
        self.conn = self.sched.connector
        self.worker = U.worker_connector(self.vc, self.kcc)
        self.worker.register_kv_caches(self.caches)
        assert self.conn.client.wait_for_session(5) or sock.startswith("/nonexistent")

    def step(self, seed=1, fill=True):
        return U.run_step(self.sched, self.worker, self.caches, self.packing, seed, fill)

    def add(self, rid, tokens, max_tokens=1):
        req = U.request(rid, tokens, max_tokens)
        self.sched.add_request(req)
        return req

    def close(self):
        self.conn.shutdown()
        self.worker.shutdown()


def prompt(n, salt=0):
    return [(i * 7 + salt) % 256 for i in range(n)]


# -- factory and configuration --------------------------------------------------


def test_factory_creates_connector_from_module_path(daemons, models):
    d = daemons()
    vc = U.vllm_config(models["a"], {"endpoint": d.sock, "kv_packing": "head_blocks"})
    kt = vc.kv_transfer_config
    assert kt.kv_connector_module_path == "radixkv.integrations.vllm"
    cls = KVConnectorFactory.get_connector_class(kt)
    assert cls is rv.RadixKVConnector
    assert issubclass(cls, KVConnectorBase_V1)
    kcc = U.kv_cache_config(vc)
    sched = KVConnectorFactory.create_connector(vc, KVConnectorRole.SCHEDULER, kcc)
    worker = KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, kcc)
    try:
        assert isinstance(sched, rv.RadixKVConnector) and sched.role == KVConnectorRole.SCHEDULER
        assert worker.role == KVConnectorRole.WORKER and worker.client is None
        assert sched.client.wait_for_session(5)
        spec = sched.namespace
        assert (spec.model, spec.num_layers, spec.num_kv_heads, spec.head_dim,
                spec.page_size, spec.dtype, spec.tp_size) == (
            models["a"], 2, 2, 32, 16, radixkv.keys.dtype_value("fp32"), 1)
        # The namespace the daemon bound is the one derived from vLLM's config.
        assert sched.client.state().namespace_id == radixkv.namespace_root(spec)
        # A cache miss must never fail a request.
        assert vc.kv_transfer_config.kv_load_failure_policy == "recompute"
    finally:
        sched.shutdown()
        worker.shutdown()


def test_namespace_follows_every_kv_relevant_field(models):
    base = rv.namespace_for_vllm_config(U.vllm_config(models["a"], {}))
    fp16 = rv.namespace_for_vllm_config(U.vllm_config(models["a"], {}, dtype="float16"))
    blk32 = rv.namespace_for_vllm_config(U.vllm_config(models["a"], {}, block_size=32))
    other = rv.namespace_for_vllm_config(U.vllm_config(models["b"], {}))
    pinned = rv.namespace_for_vllm_config(
        U.vllm_config(models["a"], {"model": "org/tiny", "model_revision": "r1"}))
    assert fp16.dtype == radixkv.keys.dtype_value("fp16") != base.dtype
    assert blk32.page_size == 32
    assert (pinned.model, pinned.model_revision) == ("org/tiny", "r1")
    roots = {radixkv.namespace_root(s) for s in (base, fp16, blk32, other, pinned)}
    assert len(roots) == 5
    assert '"kv_cache_dtype":"auto"' in base.model_revision


def test_bad_extra_config_names_the_key(models):
    vc = U.vllm_config(models["a"], {"endpiont": "/tmp/x.sock"})
    with pytest.raises(radixkv.InvalidArgument) as e:
        KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, U.kv_cache_config(vc))
    assert e.value.field == "kv_connector_extra_config.endpiont"
    vc = U.vllm_config(models["a"], {"call_timeout": -1})
    with pytest.raises(radixkv.InvalidArgument) as e:
        KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, U.kv_cache_config(vc))
    assert e.value.field == "kv_connector_extra_config.call_timeout"


def test_unknown_attention_backend_is_refused_at_register(models):
    # Without kv_packing the connector asks vLLM for the attention backend;
    # one whose K/V packing it does not know (here: none resolvable on
    # this machine) is an error naming the field, never a guess.
    vc = U.vllm_config(models["a"], {"initial_wait": 0})
    kcc = U.kv_cache_config(vc)
    worker = U.worker_connector(vc, kcc)
    with pytest.raises(radixkv.InvalidArgument) as e:
        worker.register_kv_caches(U.allocate(kcc, "LBHNC"))
    assert e.value.field == "attention_backend"


@pytest.mark.parametrize("what,field", [("heads", "num_kv_heads"), ("dtype", "dtype"),
                                        ("head_dim", "head_dim"), ("block", "block_size")])
def test_kv_caches_that_do_not_match_the_namespace_are_refused(models, what, field):
    vc = U.vllm_config(models["a"], {"kv_packing": "content_split", "initial_wait": 0})
    worker = U.worker_connector(vc, U.kv_cache_config(vc))
    shape = {"heads": (8, 4, 16, 64), "dtype": (8, 2, 16, 64),
             "head_dim": (8, 2, 16, 128), "block": (8, 2, 32, 64)}[what]
    dtype = torch.float16 if what == "dtype" else torch.float32
    with pytest.raises(radixkv.InvalidArgument) as e:
        worker.register_kv_caches({n: torch.zeros(shape, dtype=dtype) for n in U.LAYER_NAMES})
    assert e.value.field == field


def test_block_size_that_does_not_fit_the_pool_is_refused_at_start(daemons, models):
    d = daemons(pool="host,bytes=16MiB,page_bytes=16384")
    vc = U.vllm_config(models["a"], {"endpoint": d.sock}, block_size=32)
    with pytest.raises(radixkv.Error) as e:
        KVConnectorFactory.create_connector(vc, KVConnectorRole.SCHEDULER, U.kv_cache_config(vc))
    assert e.value.field.startswith("namespace"), e.value
    no_leaks(d)


# -- save, commit, hit, load ----------------------------------------------------


@pytest.mark.parametrize("layout,packing", [
    ("LBHNC", "head_blocks"),      # the CPU backend's layout and packing
    ("LBNHC", "content_split"),    # FlashAttention-style NHD
    ("LBHNC", "content_split"),    # FlashInfer/Triton HND
    ("BLHNC", "content_split"),    # block-outermost (cross-layer blocks)
])
def test_save_then_hit_loads_bit_exact(daemons, models, layout, packing):
    d = daemons()
    a = Engine(models["a"], d.sock, layout, packing)
    b = Engine(models["a"], d.sock, layout, packing)
    try:
        tokens = prompt(40)                      # 2 full blocks + 8 tokens
        a.add("r1", tokens)
        so, meta, wmeta, errs = a.step(seed=5)
        assert meta.loads == [] and errs == set()
        assert [s.block_indices for s in meta.saves] == [[0, 1]]
        saved_blocks = meta.saves[0].block_ids
        assert wmeta.saves == {(meta.saves[0].token, 0): [1, 0],
                               (meta.saves[0].token, 1): [1, 0]}
        # Committed in block order, lease ended: the daemon holds 2 blocks.
        assert a.conn.held_leases() == []
        assert a.conn.client.match(tokens).matched_blocks == 2
        no_leaks(d)

        # The pages hold radixkv's layout: page[l, kv, head, slot, dim].
        views = U.kv_views(a.caches, packing)
        with a.conn.client.acquire(tokens, allocate=False) as lease:
            pool = radixkv.attach(d.attach_sock, a.conn.client.state().session_id)
            for j, blk in enumerate(saved_blocks):
                page = pool.page_tensor(lease.pages[j], a.conn.namespace)
                for li, name in enumerate(sorted(views)):
                    k, v = views[name]
                    assert torch.equal(U.bits(page[li, 0]), U.bits(k[blk]))
                    assert torch.equal(U.bits(page[li, 1]), U.bits(v[blk]))
            pool.close()

        # A second engine (its own, empty prefix cache) with a longer prompt
        # sharing the 2 blocks loads them.
        req = b.add("r2", tokens + prompt(20, salt=3))
        assert b.conn.get_num_new_matched_tokens(req, 0) == (32, False)
        so2, meta2, _, errs2 = b.step(seed=6)
        assert errs2 == set()
        assert so2.scheduled_new_reqs[0].num_computed_tokens == 32
        assert so2.num_scheduled_tokens["r2"] == 60 - 32
        assert len(meta2.loads) == 1 and len(meta2.loads[0].block_ids) == 2
        bviews = U.kv_views(b.caches, packing)
        for name in views:
            for src, dst in zip(saved_blocks, meta2.loads[0].block_ids):
                assert torch.equal(U.bits(bviews[name][0][dst]), U.bits(views[name][0][src]))
                assert torch.equal(U.bits(bviews[name][1][dst]), U.bits(views[name][1][src]))
        # r2's third block (tokens 32..47) was computed and saved.
        assert [s.block_indices for s in meta2.saves] == [[2]]
        assert b.conn.client.match(tokens + prompt(20, salt=3)).matched_blocks == 3
        assert b.sched.requests.get("r2") is None or \
            b.sched.requests["r2"].status == RequestStatus.FINISHED_LENGTH_CAPPED
    finally:
        a.close()
        b.close()
    no_leaks(d)


def test_chunked_prefill_saves_each_block_in_the_step_that_completes_it(daemons, models):
    d = daemons()
    a = Engine(models["a"], d.sock, max_batched=40)
    b = Engine(models["a"], d.sock)
    try:
        tokens = prompt(100)                     # 6 full blocks + 4 tokens
        a.add("r1", tokens)
        saved, matched = [], []
        for step in range(3):                    # chunks of 40, 40, 20 tokens
            so, meta, _, _ = a.step(seed=4)
            assert so.num_scheduled_tokens["r1"] == [40, 40, 20][step]
            saved.append([s.block_indices for s in meta.saves])
            matched.append(a.conn.client.match(tokens).matched_blocks)
        # Tokens 0..39 complete blocks 0-1, 0..79 blocks 2-4, 0..99 block 5.
        assert saved == [[[0, 1]], [[2, 3, 4]], [[5]]]
        assert matched == [2, 5, 6]              # committed step by step, in order
        assert a.conn.held_leases() == []
        no_leaks(d)
        req = b.add("r2", tokens)
        assert b.conn.get_num_new_matched_tokens(req, 0) == (96, False)
        so, meta, _, errs = b.step()
        assert errs == set() and len(meta.loads[0].block_ids) == 6
        bv = U.kv_views(b.caches, "head_blocks")
        want = U.expected_blocks(a.caches, "head_blocks", 6, seed=4)
        for name, rows in want.items():
            for j, dst in enumerate(meta.loads[0].block_ids):
                assert torch.equal(U.bits(bv[name][0][dst]), U.bits(rows[j][0]))
                assert torch.equal(U.bits(bv[name][1][dst]), U.bits(rows[j][1]))
    finally:
        a.close()
        b.close()
    no_leaks(d)


def test_last_prompt_token_always_runs(daemons, models):
    d = daemons()
    a = Engine(models["a"], d.sock)
    try:
        a.add("r1", prompt(48))                 # exactly 3 blocks
        a.step()
        assert a.conn.client.match(prompt(48)).matched_blocks == 3
        b = Engine(models["a"], d.sock)
        try:
            same = U.request("same", prompt(48))
            longer = U.request("longer", prompt(49))
            assert b.conn.get_num_new_matched_tokens(same, 0) == (32, False)
            assert b.conn.get_num_new_matched_tokens(longer, 0) == (48, False)
            # vLLM's own prefix cache answered 16 tokens: only the rest.
            assert b.conn.get_num_new_matched_tokens(longer, 16) == (32, False)
            b.conn.request_finished(same, [])
            b.conn.request_finished(longer, [])
        finally:
            b.close()
    finally:
        a.close()
    no_leaks(d)


def test_two_processes_share_one_daemon_bit_exact(daemons, models):
    d = daemons()
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    util = os.path.join(HERE, "_vllm_util.py")
    results = []
    for mode in ("save", "load"):
        out = subprocess.run([sys.executable, util, mode, d.sock, models["a"], "LBNHC",
                              "content_split", "11", "72"], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-4000:]
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    save, load = results
    assert save["saves"] == 4 and save["loads"] == 0
    assert load["loads"] == 4 and load["load_errors"] == 0
    assert load["num_computed_tokens"] == 64
    assert load["bit_exact"] is True
    no_leaks(d)


def test_two_models_on_one_daemon_never_share_a_block(daemons, models):
    d = daemons()
    a = Engine(models["a"], d.sock)
    b = Engine(models["b"], d.sock)
    try:
        assert a.conn.namespace.page_bytes == b.conn.namespace.page_bytes
        a.add("r1", prompt(64))
        a.step()
        assert a.conn.client.match(prompt(64)).matched_blocks == 4
        req = U.request("rb", prompt(64))
        assert b.conn.get_num_new_matched_tokens(req, 0) == (0, False)
        assert b.conn.client.match(prompt(64)).matched_blocks == 0
        b.conn.request_finished(req, [])
    finally:
        a.close()
        b.close()
    no_leaks(d)


# -- faults ---------------------------------------------------------------------


def test_daemon_down_is_a_miss_and_the_request_runs(models):
    a = Engine(models["a"], "/nonexistent/radixkvd.sock", extra={"initial_wait": 0})
    try:
        a.add("r1", prompt(40))
        so, meta, _, errs = a.step()
        assert so.scheduled_new_reqs[0].num_computed_tokens == 0
        assert so.num_scheduled_tokens["r1"] == 40
        assert (meta.loads, meta.saves, errs) == ([], [], set())
        assert "r1" not in a.sched.requests          # finished (max_tokens=1)
    finally:
        a.close()


def test_daemon_restart_between_lookup_and_step(daemons, models):
    d = daemons()
    a = Engine(models["a"], d.sock)
    try:
        a.add("warm", prompt(40, salt=9))
        a.step()
        tokens = prompt(40)
        a.add("r1", tokens)
        so = a.sched.schedule()                       # lookup, alloc, meta with saves
        meta = so.kv_connector_metadata
        assert [s.block_indices for s in meta.saves] == [[0, 1]]
        d.stop()
        d.start()                                     # a new daemon on the same socket
        # The in-flight step on a worker that has not mapped the old
        # session's pool yet: the new daemon refuses the attach for the old
        # session, the saves fail, nothing is committed, the request runs.
        # (A worker that mapped it before writes into the old daemon's
        # memory, which no one reads; the commit then fails: also no block.)
        w = U.worker_connector(a.vc, a.kcc)
        w.register_kv_caches(a.caches)
        w.bind_connector_metadata(meta)
        w.start_load_kv(None)
        for name in sorted(a.caches):
            w.save_kv_layer(name, a.caches[name], None)
        w.wait_for_save()
        wmeta = w.build_connector_worker_meta()
        w.clear_connector_metadata()
        assert all(ack == [0, 1] for ack in wmeta.saves.values())
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
        a.sched.update_from_output(so, ModelRunnerOutput(
            req_ids=["r1"], req_id_to_index={"r1": 0}, sampled_token_ids=[[7]],
            kv_connector_output=KVConnectorOutput(kv_connector_worker_meta=wmeta)))
        assert "r1" not in a.sched.requests
        assert a.conn.held_leases() == []
        w.shutdown()
        # The client reconnects; the new daemon serves hits again.
        assert a.conn.client.wait_for_session(10)
        assert a.conn.client.match(tokens).matched_blocks == 0
        a.add("r2", tokens)
        a.step()
        assert a.conn.client.match(tokens).matched_blocks == 2
    finally:
        a.close()
    no_leaks(d)


def test_abort_between_lookup_and_load_leaks_nothing(daemons, models):
    d = daemons()
    a = Engine(models["a"], d.sock)
    b = Engine(models["a"], d.sock)
    try:
        a.add("r1", prompt(64))
        a.step()
        # Looked up (lease held), never scheduled, aborted.
        waiting = b.add("w", prompt(64))
        assert b.conn.get_num_new_matched_tokens(waiting, 0) == (48, False)
        assert d.wait_stats(lambda s: s.leases == 1).leases == 1   # r1's ended
        b.sched.finish_requests("w", RequestStatus.FINISHED_ABORTED)
        assert b.conn.held_leases() == []
        no_leaks(d)
        # Looked up and scheduled (load planned), aborted before the step ran.
        b.add("r2", prompt(64))
        so = b.sched.schedule()
        assert len(so.kv_connector_metadata.loads) == 1
        b.sched.finish_requests("r2", RequestStatus.FINISHED_ABORTED)
        assert b.conn.held_leases() == ["r2"]        # the step still copies its pages
        b.worker.bind_connector_metadata(so.kv_connector_metadata)
        b.worker.start_load_kv(None)
        b.worker.wait_for_save()
        wmeta = b.worker.build_connector_worker_meta()
        b.worker.clear_connector_metadata()
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
        b.sched.update_from_output(so, ModelRunnerOutput(
            req_ids=["r2"], req_id_to_index={"r2": 0}, sampled_token_ids=[[7]],
            kv_connector_output=KVConnectorOutput(kv_connector_worker_meta=wmeta)))
        assert b.conn.held_leases() == []
        no_leaks(d)
    finally:
        a.close()
        b.close()


def test_preemption_releases_the_lease(daemons, models):
    import dataclasses
    d = daemons()
    a = Engine(models["a"], d.sock)
    try:
        a.add("r1", prompt(64))
        so, meta, wmeta, _ = a.step()                 # saves blocks 0..3, commits
        a.add("r2", prompt(40, salt=1) + prompt(200, salt=2))
        so = a.sched.schedule()
        assert a.conn.held_leases() == ["r2"]
        # The step ran (its acknowledgements arrive), then r2 is preempted.
        a.worker.bind_connector_metadata(so.kv_connector_metadata)
        a.worker.wait_for_save()
        a.conn.update_connector_output(type("O", (), {
            "kv_connector_worker_meta": a.worker.build_connector_worker_meta()})())
        a.worker.clear_connector_metadata()
        empty = dataclasses.replace(
            so, scheduled_new_reqs=[], num_scheduled_tokens={},
            preempted_req_ids={"r2"},
            scheduled_cached_reqs=type(so.scheduled_cached_reqs).make_empty())
        a.conn.build_connector_meta(empty)
        assert a.conn.held_leases() == []
        no_leaks(d)
        # Rescheduled after preemption: a new lookup, a new lease.
        req = a.sched.requests["r2"]
        assert a.conn.get_num_new_matched_tokens(req, 0)[0] >= 0
        assert a.conn.held_leases() == ["r2"]
        a.conn.request_finished(req, [])
    finally:
        a.close()
    no_leaks(d)


_KILLED_WORKER = r"""
import pickle, sys, time
sys.path[:0] = sys.argv[4:]
import _vllm_util as U
vc = U.vllm_config(sys.argv[2], {"endpoint": sys.argv[1], "kv_packing": "head_blocks"})
kcc = U.kv_cache_config(vc)
caches = U.allocate(kcc, "LBHNC")
w = U.worker_connector(vc, kcc)
w.register_kv_caches(caches)
with open(sys.argv[3], "rb") as f:
    w.bind_connector_metadata(pickle.load(f))
w.start_load_kv(None)
w.save_kv_layer(U.LAYER_NAMES[0], caches[U.LAYER_NAMES[0]], None)
print("mid-save", flush=True)
time.sleep(600)
"""


def test_worker_killed_mid_save_leaks_nothing(daemons, models, tmp_path):
    d = daemons()
    a = Engine(models["a"], d.sock)
    proc = None
    try:
        a.add("r1", prompt(64))
        so = a.sched.schedule()
        meta = so.kv_connector_metadata
        assert [s.block_indices for s in meta.saves] == [[0, 1, 2, 3]]
        path = tmp_path / "meta.pkl"
        path.write_bytes(pickle.dumps(meta))
        proc = subprocess.Popen(
            [sys.executable, "-c", _KILLED_WORKER, d.sock, models["a"], str(path), HERE,
             os.path.join(HERE, "..", "python")], stdout=subprocess.PIPE, text=True,
            env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
        line = proc.stdout.readline()
        assert line.strip() == "mid-save", line
        assert d.stats().writing_pages == 4
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        # The engine goes down with its worker: the scheduler side shuts down.
        a.conn.shutdown()
        no_leaks(d)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        a.worker.shutdown()
    # Nothing of the killed save was cached.
    with radixkv.Client(endpoint=d.sock, namespace=a.conn.namespace) as c:
        assert c.match(prompt(64)).matched_blocks == 0
    no_leaks(d)
