"""Starting the engine process of `--isolate` (service/isolate/host.py): spawn it beside a one-use listener, accept
its connection, wait for its Ready; and waiting for it to exit. RemoteEngine (remote.py) runs these for each start.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
from multiprocessing.connection import Connection, Listener

from engine.load_stop import LOADS, StopFlag
from service.config import CONFIG_ENV, ServiceConfig
from service.isolate.messages import ADDRESS_ENV, AUTHKEY_ENV, Failed, Ready, Shutdown

__all__ = ["spawn", "accept", "receive_ready", "wait_exit"]

CONNECT_SECONDS = 120.0  # a child that never connects


def spawn(config: ServiceConfig) -> tuple[Listener, subprocess.Popen[bytes]]:
    """A listener and the engine process told its address. Call it on the event loop's thread: the child's
    PR_SET_PDEATHSIG fires when the thread that started it ends, and a worker thread ends when idle. Raises
    OSError when the process cannot start."""
    key = secrets.token_bytes(32)
    listener = Listener(family="AF_UNIX", authkey=key)
    env = {**os.environ, CONFIG_ENV: config.to_json(), ADDRESS_ENV: str(listener.address), AUTHKEY_ENV: key.hex()}
    return listener, subprocess.Popen([sys.executable, "-m", "service.isolate.host"], env=env)


def accept(listener: Listener, process: subprocess.Popen[bytes]) -> Connection:
    """The engine process's connection (blocks; the listener is closed after). Raises RuntimeError when it does not
    connect within CONNECT_SECONDS (it is killed)."""
    watchdog = threading.Timer(CONNECT_SECONDS, listener.close)
    watchdog.start()
    try:
        return listener.accept()
    except OSError as exc:
        process.kill()
        raise RuntimeError("the engine process did not connect") from exc
    finally:
        watchdog.cancel()
        listener.close()


def receive_ready(conn: Connection, stop: StopFlag = LOADS) -> Ready:
    """Wait (blocking) until the engine process loaded its model. Should this process begin to stop meanwhile
    (`stop`: a Ctrl-C during a first start's conversion, engine/load_stop.py), the engine process is told, gives the
    load up and exits. Raises RuntimeError with its reason when it could not start, EOFError when it exited first."""
    forget = stop.on_set(lambda: conn.send(Shutdown()))
    try:
        while True:
            message = conn.recv()
            if isinstance(message, Ready):
                return message
            if isinstance(message, Failed):
                raise RuntimeError(f"the engine process could not start: {message.error.kind}: {message.error.message}")
    finally:
        forget()


def wait_exit(process: subprocess.Popen[bytes] | None, timeout: float = 30.0) -> int | None:
    """The engine process's exit status, killing it after `timeout` seconds; None without a process. Raises
    nothing."""
    if process is None:
        return None
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()
