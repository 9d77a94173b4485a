"""python -m zoo.bench.serve stops a server with every process it started: vLLM's EngineCore and Worker outlived a
killed api_server and took the CPU the next server was measured on."""

import os
import subprocess
import time

from zoo.bench.serve import stop


def test_stopping_a_server_kills_the_processes_it_started(tmp_path):
    pid_file = tmp_path / "child"
    proc = subprocess.Popen(["bash", "-c", f"sleep 300 & echo $! > {pid_file}; wait"], start_new_session=True)
    for _ in range(100):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        time.sleep(0.05)
    child = int(pid_file.read_text())
    stop(proc)
    for _ in range(100):  # the child, reparented once its parent died, is reaped by init
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        if open(f"/proc/{child}/stat").read().split()[2] == "Z":
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the server's child {child} outlived it")
