"""bench/spy_threads.py: py-spy's raw stacks summarised per thread, GIL hand-off waits told apart."""

from __future__ import annotations

from bench.spy_threads import main, summarise

RAW = [
    "thread (1): tandem-engine;thread_run (libpython3.12.so);Engine.step (engine/step.py:10);"
    "CompiledDecode.run (engine/compiled_decode.py:97);pthread_cond_wait (libc.so.6);0x7f00 (libc.so.6) 3\n",
    "thread (1): tandem-engine;thread_run (libpython3.12.so);Engine.step (engine/step.py:10);"
    "DecodePipeline.launch (engine/pipeline.py:105);0x7f01 (core.so);pthread_cond_wait (libc.so.6) 5\n",
    "thread (2): MainThread;run (granian/server/mp.py:249);epoll_pwait (libc.so.6) 2\n",
]


def test_a_wait_straight_out_of_a_python_frame_is_the_gil_and_one_inside_native_code_is_not() -> None:
    by = summarise(RAW)
    engine = by["tandem-engine"]
    assert engine["GIL-WAIT CompiledDecode.run (compiled_decode.py:97) > (libc.so.6)"] == 3
    assert engine["DecodePipeline.launch (pipeline.py:105) > pthread_cond_wait (libc.so.6)"] == 5
    assert by["MainThread"]["run (mp.py:249) > epoll_pwait (libc.so.6)"] == 2


def test_main_prints_each_threads_gil_share(tmp_path, capsys) -> None:
    path = tmp_path / "p.raw"
    path.write_text("".join(RAW))
    assert main([str(path), "--thread", "engine"]) == 0
    out = capsys.readouterr().out
    assert "tandem-engine: 8 samples, 37.5 % waiting for the GIL" in out and "MainThread" not in out
