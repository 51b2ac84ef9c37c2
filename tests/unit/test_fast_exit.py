"""run_cli(fast_exit=True): the exit code, atexit handlers and buffered output survive skipping the interpreter's
teardown; a running non-daemon thread gets the ordinary exit, which waits for it."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import atexit, sys, threading, time
    from corecpu.errors import run_cli
    atexit.register(lambda: open(sys.argv[1], "w").write("handler ran"))
    def main():
        sys.stdout.write("no newline, still buffered")
        if sys.argv[2] == "thread":
            threading.Thread(target=lambda: (time.sleep(0.5), open(sys.argv[1] + ".thread", "w").write("done"))).start()
        return 3
    run_cli(main, fast_exit=True)
    print("unreachable")
""")


def _run(tmp_path, mode):
    mark = tmp_path / "mark"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(mark), mode], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=60)
    return proc, mark


def test_the_code_the_handlers_and_the_buffered_output_survive(tmp_path):
    proc, mark = _run(tmp_path, "plain")
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "no newline, still buffered"
    assert mark.read_text() == "handler ran"


def test_a_running_non_daemon_thread_is_waited_for(tmp_path):
    proc, mark = _run(tmp_path, "thread")
    assert proc.returncode == 3, proc.stderr
    assert (tmp_path / "mark.thread").read_text() == "done"
    assert mark.read_text() == "handler ran"
