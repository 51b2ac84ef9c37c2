"""corecpu.notices: plain `corecpu: warning:` lines, once per job (rank 0) or once per host (local rank 0)."""

from __future__ import annotations

import pytest

from corecpu import notices


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(notices, "_said", set())


@pytest.mark.parametrize("env, job, host", [
    ({}, True, True),  # one process
    ({"PMI_RANK": "0", "MPI_LOCALRANKID": "0"}, True, True),
    ({"PMI_RANK": "3", "MPI_LOCALRANKID": "0"}, False, True),  # rank 3 is the first on its host
    ({"PMI_RANK": "1", "MPI_LOCALRANKID": "1"}, False, False),
    ({"RANK": "1", "LOCAL_RANK": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}, False, False),  # torchrun in sbatch
    ({"SLURM_PROCID": "2"}, False, False),  # no local variable: per host falls back to the job's rank
])
def test_who_speaks(env, job, host):
    assert notices.is_first(env=env) is job and notices.is_first(per_host=True, env=env) is host


def test_a_warning_is_one_plain_line_said_once(capsys):
    assert notices.warn("the cache is odd; fix it", env={})
    assert not notices.warn("the cache is odd; fix it", env={})
    assert not notices.warn("only rank 0 says this", env={"PMI_RANK": "1"})
    assert capsys.readouterr().err == "corecpu: warning: the cache is odd; fix it\n"


def test_a_slow_phase_is_said_as_it_starts_and_ends_by_rank_0_only(capsys):
    with notices.phase("tokenizing 87,599 examples", env={}):
        assert capsys.readouterr().out == "tokenizing 87,599 examples...\n"  # before the work, not after
    assert capsys.readouterr().out.startswith("tokenizing 87,599 examples: 0.0 s")
    with notices.phase("tokenizing", env={"PMI_RANK": "1"}):
        pass
    assert not notices.say("only rank 0", env={"RANK": "2"}) and capsys.readouterr().out == ""
