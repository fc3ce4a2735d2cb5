"""service/isolate/launch.py: waiting for the engine process's Ready, and this process stopping meanwhile."""

from __future__ import annotations

import threading
from multiprocessing import Pipe

from engine.load_stop import StopFlag
from service.isolate.launch import receive_ready
from service.isolate.messages import Shutdown


def test_a_stop_while_the_engine_process_loads_tells_it_and_the_wait_ends() -> None:
    # Ctrl-C during an --isolate first start's conversion: the engine process converted and loaded on, unasked.
    ours, theirs = Pipe()
    stop, ended = StopFlag(), []

    def wait() -> None:
        try:
            receive_ready(ours, stop)
        except EOFError as exc:
            ended.append(exc)

    waiting = threading.Thread(target=wait, daemon=True)
    waiting.start()
    stop.set()  # this process begins to stop
    assert theirs.poll(30) and isinstance(theirs.recv(), Shutdown)  # the engine process is told
    theirs.close()  # and exits, giving its load up
    waiting.join(30)
    assert not waiting.is_alive() and len(ended) == 1


def test_the_engine_process_is_not_told_by_a_stop_after_it_became_ready() -> None:
    from service.isolate.messages import Ready

    ours, theirs = Pipe()
    stop = StopFlag()
    theirs.send(Ready("tiny", 2048, 400, None, [], 1234))
    assert receive_ready(ours, stop).model_name == "tiny"
    stop.set()  # a later stop is the drain's business (close), not this wait's
    assert not theirs.poll(0)
