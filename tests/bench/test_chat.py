"""bench/chat.py's options: a mistake is argparse's usage error (exit 2), never a traceback mid-run."""

from __future__ import annotations

import pytest

import bench.chat
from bench.chat import cli


def test_levels_are_positive_integers() -> None:
    assert bench.chat.stream_levels("1,4,8") == (1, 4, 8)
    assert bench.chat.stream_levels(" 2, 16") == (2, 16)


@pytest.mark.parametrize("options", [["--levels", "abc"], ["--levels", "0"], ["--levels", "1,,4"],
                                     ["--levels", "-1"], ["--max-tokens", "0"]])
def test_a_bad_option_is_a_usage_error_before_anything_runs(options: list[str], monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # --levels abc was a ValueError traceback; --levels 0 started a server, then failed in statistics.mean.
    ran: list[object] = []
    monkeypatch.setattr(bench.chat, "main", lambda *a: ran.append(a))
    with pytest.raises(SystemExit) as done:
        cli([*options, "--no-peer"])
    assert done.value.code == 2 and not ran
    err = capsys.readouterr().err
    assert f"argument {options[0]}" in err and "Traceback" not in err, err


def test_good_options_reach_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[tuple[object, ...]] = []
    monkeypatch.setattr(bench.chat, "main", lambda *a: ran.append(a))
    assert cli(["--levels", "2,3", "--max-tokens", "5", "--no-peer"]) == 0
    assert ran == [(None, (2, 3), 5, None, False)]


CHILD_RUN = """
import signal, subprocess, sys
import bench.chat

children = []

def serve(cmd, port, env):  # a stand-in server: the test checks it is stopped with the benchmark
    children.append(subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"]))
    return children[-1]

def run_load(*a):  # runs until the signal comes; the pid is told once the run is under way (a SIGTERM as the
    print(children[-1].pid, flush=True)  # server was starting, before measure_server's try, orphaned it: flaky)
    signal.pause()

bench.chat._serve = serve
bench.chat.run_load = run_load
import engine.models
engine.models.hf_dir_for = lambda spec: "/nonexistent/model"
sys.exit(bench.chat.cli(["--no-peer", "--levels", "1"]))
"""


def test_a_sigterm_to_the_benchmark_alone_stops_its_server() -> None:
    # `kill PID` of `tandem benchmark chat` left its server running (a signal to the pid, not the group).
    import contextlib
    import os
    import signal
    import subprocess
    import sys

    bench_run = subprocess.Popen([sys.executable, "-c", CHILD_RUN], stdout=subprocess.PIPE, text=True)
    assert bench_run.stdout is not None
    server = next(int(line) for line in bench_run.stdout if line.strip().isdigit())  # after the run's own lines
    try:
        bench_run.send_signal(signal.SIGTERM)
        assert bench_run.wait(timeout=60) == 128 + signal.SIGTERM
        with pytest.raises(ProcessLookupError):  # stopped and reaped by the benchmark before it exited
            os.kill(server, 0)
    finally:  # a failing run leaves nothing behind
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGKILL)
