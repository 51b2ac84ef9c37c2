"""Tier 1: the decisions behind preemption, the launcher lifeline and the hang watchdog."""

from __future__ import annotations

import signal
from datetime import timedelta

from corecpu.reliability import lifeline

from corecpu.reliability import preempt

from corecpu.reliability import watchdog
from corecpu.reliability.watchdog import Beat, diagnose, effective_timeout


# ---------------------------------------------------------------- preempt
def test_first_stop_signal_stops_duplicate_is_ignored_repeat_exits():
    state = preempt.StopState()
    assert preempt.on_signal(state, signal.SIGUSR1, now=100.0) == "stop"
    assert state.signum == signal.SIGUSR1
    assert preempt.on_signal(state, signal.SIGTERM, now=100.0 + preempt.REPEAT_AFTER_S / 2) == "ignore"
    assert preempt.on_signal(state, signal.SIGINT, now=100.0 + preempt.REPEAT_AFTER_S) == "exit"
    assert state.signum == signal.SIGUSR1  # the first signal is the one the stop line names


def test_other_signals_are_not_stop_requests():
    state = preempt.StopState()
    assert preempt.on_signal(state, signal.SIGCHLD, now=0.0) == "ignore" and state.signum == 0


def test_stop_line():
    assert preempt.stop_line(signal.SIGTERM, 132, "step-00000132") == (
        "stopped by SIGTERM at step 132; checkpoint step-00000132 written; continue with --resume auto")


def test_stop_agreement_without_a_process_group_is_the_local_flag():
    preempt.install()
    try:
        assert preempt.stop_requested_everywhere() == 0
        preempt._state.signum = signal.SIGTERM
        assert preempt.stop_requested_everywhere() == signal.SIGTERM
    finally:
        preempt.uninstall()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_stop_agreement_by_other_means_is_asked_with_this_ranks_flag():
    # The shared optimizer step agrees through shared memory (ShmSync.agree_max) instead of the process group.
    asked: list[int] = []
    preempt.install()
    try:
        preempt._state.signum = signal.SIGUSR1
        assert preempt.stop_requested_everywhere(lambda x: asked.append(x) or signal.SIGTERM) == signal.SIGTERM
    finally:
        preempt.uninstall()
    assert asked == [signal.SIGUSR1]


def test_a_run_stopped_by_a_signal_keeps_catching_them_through_its_teardown():
    # A second Ctrl-C during the close of a stopped run met Python's default handler: KeyboardInterrupt inside
    # gc.collect(), with a traceback (a CI run of the chaos test). The teardown ignores them; then they are restored.
    preempt.install()
    try:
        preempt.uninstall_unless_stopping()  # not stopped: the handlers go back
        assert not preempt.installed() and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        preempt.install()
        preempt._state.signum = signal.SIGINT
        preempt.uninstall_unless_stopping()  # stopped: the teardown ignores them
        assert all(signal.getsignal(s) == signal.SIG_IGN for s in preempt.STOP_SIGNALS)
        preempt.release_after_stop()  # and then they are Python's again
        assert not preempt.installed() and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        preempt.uninstall()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


# ---------------------------------------------------------------- lifeline
def _stat(pid: int, ppid: int, comm: str = "python") -> str:
    return f"{pid} ({comm}) S {ppid} 1 1 0 -1"


def test_ancestors_walk_up_to_init_even_with_odd_command_names():
    table = {50: _stat(50, 40, "python (rank) x"), 40: _stat(40, 30, "hydra_pmi_proxy"), 30: _stat(30, 1), 1: _stat(1, 0)}

    def read(pid: int) -> str:
        if pid not in table:
            raise FileNotFoundError(pid)
        return table[pid]

    assert lifeline.ancestors(50, read) == [40, 30, 1]


def test_launcher_is_watched_only_when_it_is_an_ancestor():
    env = {lifeline.LAUNCHER_PID_VAR: "30"}
    assert lifeline.launcher_to_watch(env, [40, 30, 1]) == 30
    assert lifeline.launcher_to_watch(env, [40, 31, 1]) is None  # another host or PID namespace
    assert lifeline.launcher_to_watch({}, [40, 30, 1]) is None
    assert lifeline.launcher_to_watch({lifeline.LAUNCHER_PID_VAR: "x"}, [40]) is None


# ---------------------------------------------------------------- watchdog
HOSTS = {0: "host-a", 1: "host-b", 2: "host-b"}


def beats(*pairs: tuple[int, int]) -> dict[int, Beat]:
    return {r: Beat(b, s) for r, (b, s) in enumerate(pairs)}


def test_timeout_grows_with_the_slowest_step():
    assert effective_timeout(300, 2.0) == 300
    assert effective_timeout(20, 10.0) == 10.0 * watchdog.SLOW_FACTOR


def test_a_rank_whose_heartbeat_stands_still_is_named():
    line, reporter = diagnose(0, 3, beats((5, 87), (9, 87), (4, 87)), beats((8, 87), (9, 87), (7, 87)), HOSTS, 87, 120.4)
    assert line == "rank 1 on host-b stopped responding at step 87; 120 s without progress"
    assert reporter == 0


def test_rank_0_stopped_means_its_store_does_not_answer_and_rank_1_reports():
    line, reporter = diagnose(2, 3, None, None, HOSTS, 41, 30)
    assert line.startswith("rank 0 on host-a stopped responding at step 41 (its rendezvous store does not answer)")
    assert reporter == 1


def test_all_alive_but_one_behind():
    line, reporter = diagnose(1, 3, beats((1, 10), (1, 11), (1, 11)), beats((4, 10), (4, 11), (4, 11)), HOSTS, 11, 60)
    assert line.startswith("rank 0 on host-a is behind at step 10 (others at 11)") and reporter == 0


def test_all_alive_same_step_names_nobody():
    line, _ = diagnose(1, 2, beats((1, 10), (1, 10)), beats((4, 10), (4, 10)), HOSTS, 10, 60)
    assert line.startswith("no rank finished step 11; every rank is alive")


class FakeStore:
    """A dict with the TCPStore calls the watchdog uses; `frozen` ranks stop beating."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.frozen: set[int] = set()

    def set(self, key: str, value: str) -> None:
        self.data[key] = value.encode()

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.data[k] for k in keys]

    def clone(self) -> "FakeStore":
        return self

    def set_timeout(self, timeout: timedelta) -> None:
        return None

    def tick(self) -> None:
        for r in range(2):
            key = watchdog.KEY.format(r)
            if key in self.data and r not in self.frozen:
                beat, step = self.data[key].decode().split()
                self.data[key] = f"{int(beat) + 1} {step}".encode()


def make_watchdog(store: FakeStore, clock: list[float], exits: list[int]) -> watchdog.Watchdog:
    wd = watchdog.Watchdog(store, 0, 2, step_timeout_s=20, host="host-a", exit=exits.append,
                           clock=lambda: clock[0], set_collective_timeout=lambda s: None)
    # What start() publishes, without its threads: the test drives check_once itself.
    for r, host in ((0, "host-a"), (1, "host-b")):
        store.set(watchdog.HOST_KEY.format(r), f"{1000 + r} {host}")
        store.set(watchdog.KEY.format(r), "0 0")
    return wd


def test_check_fires_only_after_the_first_step_and_the_timeout():
    store, clock, exits = FakeStore(), [0.0], []
    wd = make_watchdog(store, clock, exits)
    clock[0] = 1000.0
    assert not wd.check_once(store, sleep=lambda s: store.tick())  # no step yet: start-up is not timed here
    wd.progress(1)
    clock[0] += 19.0
    assert not wd.check_once(store, sleep=lambda s: store.tick())
    store.frozen.add(1)
    clock[0] += 2.0
    assert wd.check_once(store, sleep=lambda s: store.tick())
    assert exits == [watchdog.EXIT_HUNG]
    assert wd.fired == "rank 1 on host-b stopped responding at step 1; 21 s without progress"


def test_paused_phases_are_not_timed():
    store, clock, exits = FakeStore(), [0.0], []
    wd = make_watchdog(store, clock, exits)
    wd.progress(1)
    store.frozen.add(1)
    with wd.paused():
        clock[0] += 1000.0
        assert not wd.check_once(store, sleep=lambda s: store.tick())
    clock[0] += 5.0
    assert not wd.check_once(store, sleep=lambda s: store.tick()) and exits == []


def test_slow_steps_raise_the_timeout():
    store, clock, exits = FakeStore(), [0.0], []
    wd = make_watchdog(store, clock, exits)
    wd.progress(1)
    clock[0] += 10.0
    wd.progress(2)  # a 10 s step: the timeout becomes 50 s
    store.frozen.add(1)
    clock[0] += 30.0
    assert not wd.check_once(store, sleep=lambda s: store.tick())
    clock[0] += 25.0
    assert wd.check_once(store, sleep=lambda s: store.tick())


# ---------------------------------------------------------------- paused phases: evaluation, checkpoint writes
def test_a_rank_stopped_while_paused_is_named_after_step_timeout():
    store, clock, exits = FakeStore(), [0.0], []
    wd = make_watchdog(store, clock, exits)
    wd.progress(3)
    with wd.paused("evaluation at step 4"):
        for _ in range(60):  # a long evaluation with every heartbeat moving: not a hang
            store.tick()
            clock[0] += 1.0
            assert not wd.check_alive(store)
        store.frozen.add(1)
        for waited in range(1, 40):
            store.tick()
            clock[0] += 1.0
            if wd.check_alive(store):
                break
    assert waited == 20 and exits == [watchdog.EXIT_HUNG]  # step_timeout_s=20, as in training
    assert wd.fired == "rank 1 on host-b stopped responding during evaluation at step 4; 20 s without a heartbeat"


def test_rank_0_whose_store_goes_silent_while_paused_is_named():
    store, clock, exits = FakeStore(), [0.0], []
    wd = watchdog.Watchdog(store, 1, 2, step_timeout_s=20, host="host-b", exit=exits.append,
                           clock=lambda: clock[0], set_collective_timeout=lambda s: None)
    for r, host in ((0, "host-a"), (1, "host-b")):
        store.set(watchdog.HOST_KEY.format(r), f"{1000 + r} {host}")
        store.set(watchdog.KEY.format(r), "0 0")
    wd.progress(1)
    with wd.paused("the checkpoint write of step 2"):
        assert not wd.check_alive(store)
        store.multi_get = lambda keys: (_ for _ in ()).throw(RuntimeError("store timed out"))  # rank 0 stopped
        clock[0] += 19.0
        assert not wd.check_alive(store)
        clock[0] += 1.0
        assert wd.check_alive(store) and exits == [watchdog.EXIT_HUNG]
    assert wd.fired.startswith("rank 0 on host-a stopped responding during the checkpoint write of step 2; 20 s")


def test_outside_a_pause_liveness_is_not_checked():
    store, clock, exits = FakeStore(), [0.0], []
    wd = make_watchdog(store, clock, exits)
    store.frozen.add(1)
    clock[0] += 1000.0
    assert not wd.check_alive(store) and exits == []  # training time is check_once's job


def test_a_firing_watchdog_asks_the_launcher_to_end_the_job_before_it_exits():
    # The launcher alone reaches a stopped rank on another host, which hydra would otherwise wait for.
    store, clock, events = FakeStore(), [0.0], []
    wd = watchdog.Watchdog(store, 0, 2, step_timeout_s=20, host="host-a", exit=lambda code: events.append(code),
                           clock=lambda: clock[0], set_collective_timeout=lambda s: None,
                           ask_launcher=lambda: events.append("end the job"))
    for r, host in ((0, "host-a"), (1, "host-b")):
        store.set(watchdog.HOST_KEY.format(r), f"{1000 + r} {host}")
        store.set(watchdog.KEY.format(r), "0 0")
    wd.progress(1)
    store.frozen.add(1)
    clock[0] += 21.0
    assert wd.check_once(store, sleep=lambda s: store.tick())
    assert events == ["end the job", watchdog.EXIT_HUNG]
    assert wd.fired == "rank 1 on host-b stopped responding at step 1; 21 s without progress"


def test_a_rank_asks_its_ancestor_launcher_to_end_the_job():
    # A child of this process, with this process as its launcher: the request arrives as END_JOB_SIGNAL.
    import os
    import subprocess
    import sys

    got: list[int] = []
    old = signal.signal(lifeline.END_JOB_SIGNAL, lambda signum, frame: got.append(signum))
    try:
        code = "from corecpu.reliability.lifeline import ask_launcher_to_end_job as a; print(a())"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "CORECPU_LAUNCHER_PID": str(os.getpid())})
        assert out.stdout.strip() == "True", out.stderr
        assert got == [lifeline.END_JOB_SIGNAL]
        # Not an ancestor (this process itself), or no launcher at all: nothing is sent.
        assert not lifeline.ask_launcher_to_end_job({"CORECPU_LAUNCHER_PID": str(os.getpid())})
        assert not lifeline.ask_launcher_to_end_job({})
        assert got == [lifeline.END_JOB_SIGNAL]
    finally:
        signal.signal(lifeline.END_JOB_SIGNAL, old)


def test_a_collective_that_lost_its_peer_is_one_line_not_a_traceback():
    import subprocess
    import sys

    gloo = RuntimeError("[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                        "[127.0.0.1]:34725. This is typically caused by a remote worker crashing. GLHF!")
    assert lifeline.peer_lost_line(0, gloo) == (
        "corecpu: error: rank 0 lost its connection to another rank in a collective (Connection closed by peer "
        "[127.0.0.1]:34725); that rank ended first, and the launcher's report names it")
    assert lifeline.peer_lost_line(0, RuntimeError("shapes do not match")) is None
    assert lifeline.peer_lost_line(0, ValueError("Broken pipe")) is None  # only a collective's RuntimeError
    # Uncaught in a rank: the line on stderr, exit code 1 as for any uncaught exception; other errors unchanged.
    code = ("from corecpu.reliability import lifeline; lifeline.quiet_lost_peer(1); "
            "raise RuntimeError('pair.cc:553] Connection reset by peer [10.0.0.2]:5. more')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stderr.splitlines() == [
        "corecpu: error: rank 1 lost its connection to another rank in a collective (Connection reset by peer "
        "[10.0.0.2]:5); that rank ended first, and the launcher's report names it"], out.stderr
