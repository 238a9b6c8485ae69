"""Rank 0's side of serving in lockstep, in this process over a one-rank group (the tiny CPU artifact):
it loads rank 0's port, broadcasts each round, refuses a round once a follower has stopped, and
closes its groups. Followers in their own processes are exercised end to end by
tests/integration/test_artifacts_across_processes.py (a tp 2 artifact served)."""


import pytest
import torch.distributed as dist

from neuron_port.artifacts.manifest import verify
from neuron_port.serve.lockstep import Lockstep


class _Stopped:
    name = "neuron-port-rank1"

    def is_alive(self) -> bool:
        return False

    def join(self, timeout=None) -> None:
        pass


def test_rank_zero_rounds_and_a_stopped_follower(tiny_e2b_artifact):
    manifest = verify(tiny_e2b_artifact)
    lockstep = Lockstep(tiny_e2b_artifact, manifest, slots=1, pad_id=0)
    try:
        assert lockstep.tp == 1 and lockstep.followers == [] and dist.is_initialized()
        assert lockstep.port.batch == manifest.batch and lockstep.port.kv_len == 64
        lockstep.round([], [([2, 5, 6], None)])  # nobody to tell, but the broadcast runs
        lockstep.followers.append(_Stopped())
        with pytest.raises(RuntimeError, match=r"follower ranks stopped: \['neuron-port-rank1'\]"):
            lockstep.round([0], [])
    finally:
        lockstep.close()
    assert not dist.is_initialized()
