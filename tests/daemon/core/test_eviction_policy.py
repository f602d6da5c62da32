"""--eviction_policy end to end: real radixkvd processes and radixkv.Client.

Four hot prompts of 8 blocks come back between scans of one-shot prompts
that push them out of a 64-page pool under lru. With turn_duel the scans'
blocks wait on the probation stack and the hot prompts hit; with lru they
never do; Stats reports the policy and where each Acquire's new blocks
went. With a tier below the pool, turn_duel keeps the scans' probation
blocks from a small tier and offers every block to one that holds the
whole run; lru offers every block. A bad policy name is a configuration
error (exit 2) naming the flag and every policy.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
from rkv_testutil import SMALL, Daemon, assert_no_leaks, executable  # noqa: E402
import radixkv  # noqa: E402

PAGES = 64


def test_an_unknown_policy_is_a_configuration_error():
    r = subprocess.run([executable("RADIXKVD"), "--eviction_policy=fifo",
                        "--metrics_listen=",
                        "--socket=/tmp/rkv-eviction-policy-unused.sock"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "--eviction_policy=fifo: not a policy; choose one of lru, turn_duel" \
        in r.stderr, r.stderr


def hot_hits(policy, tier_blocks=0):
    """The hot prompts' matched blocks; with tier_blocks, a host tier of
    that many blocks below the pool (its promotions count as matched)."""
    pool = f"host,bytes={PAGES * SMALL.page_bytes},page_bytes={SMALL.page_bytes}"
    flags = [f"--eviction_policy={policy}"]
    if tier_blocks:
        flags.append(f"--tier=host,bytes={tier_blocks * SMALL.page_bytes}")
    d = Daemon(executable("RADIXKVD"), flags, pool).start()
    try:
        ps = SMALL.page_size
        serial = [1]

        def prompt(blocks):
            # Full blocks and one more token (the last token is the one to
            # compute, so its block is never looked up).
            t = list(range(serial[0], serial[0] + blocks * ps + 1))
            serial[0] += blocks * ps + 1
            return t

        hot = [prompt(8) for _ in range(4)]
        hits = 0
        with radixkv.Client(d.sock, namespace=SMALL, release_delay=0,
                            initial_wait=10.0) as c:
            for _ in range(60):
                for h in hot:
                    with c.acquire(h) as lease:
                        hits += lease.matched_blocks
                        if lease.new_blocks:
                            lease.commit()
                for _ in range(8):
                    with c.acquire(prompt(8)) as lease:
                        if lease.new_blocks:
                            lease.commit()
        assert_no_leaks(d, sessions=0)
        s = d.stats()
        assert s.eviction_policy == policy
        requests = 60 * 12
        if policy == "lru":
            assert (s.probation_pages, s.eviction_theta, s.admitted_requests,
                    s.probation_requests) == (0, 0, 0, 0), s
        else:
            # Where every Acquire's new blocks went, and the strength that
            # keeps the scans on probation.
            assert s.admitted_requests + s.probation_requests == requests, s
            assert s.probation_requests > 0 and s.probation_pages > 0, s
            assert s.eviction_theta > 0 and s.eviction_switches >= 1, s
        if tier_blocks:
            # Every evicted block was offered to the tier or kept from it
            # by the policy, and only turn_duel keeps any from it.
            t = s.tiers[0]
            assert t.demoted_blocks + t.dropped_policy == s.evicted_pages, s
            if policy == "lru" or tier_blocks >= 60 * 8 * 8 + 4 * 8:
                # lru, or a tier that holds every block of the run.
                assert t.dropped_policy == 0 and s.eviction_tier_theta == 0, s
            else:
                assert t.dropped_policy > 0, s
                assert s.eviction_tier_theta > 0, s
        else:
            assert s.eviction_tier_theta == 0 and not s.tiers, s
        return hits
    finally:
        d.stop()


def test_turn_duel_keeps_a_hot_set_through_scans_that_lru_loses():
    lru = hot_hits("lru")
    duel = hot_hits("turn_duel")
    assert lru == 0, lru  # a reuse distance of 96 blocks over 64 pages
    assert duel > 60 * 32 // 2, (duel, lru)


def test_turn_duel_keeps_a_small_tier_for_what_it_can_serve():
    # Over a tier of 8 blocks the scans are not worth the tier's writes:
    # turn_duel drops them, counted per tier, and still beats lru. Over a
    # tier that holds the whole run it offers every block.
    small = hot_hits("turn_duel", tier_blocks=8)
    lru = hot_hits("lru", tier_blocks=8)
    assert small > lru, (small, lru)
    hot_hits("turn_duel", tier_blocks=4096)
