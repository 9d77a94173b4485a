"""gloo's C++ exceptions, thrown out of a collective in one of XLA's threads and never caught (std::terminate): the
process ends in one line naming what went, never a C++ abort. A peer killed mid-collective reaches here only now
and then (CI saw it once: process 0 killed, process 1 aborted with gloo::EnforceNotMet), so the exception is
thrown here by the C++ runtime itself (`__cxa_throw`, a type named as gloo's), in a thread, as XLA's would be."""

import subprocess
import sys

import pytest

from tests.helpers.processes import ROOT, free_port

THROW = """
import ctypes, sys, threading, time
from jax._src import distributed as jd
from zoo import distributed
me, coordinator = int(sys.argv[1]), sys.argv[2]
jd.global_state.process_id, jd.global_state.num_processes, jd.global_state.coordinator_address = me, 2, coordinator
distributed._limit = 0.5
distributed._on_terminate()
cxx = ctypes.CDLL("libstdc++.so.6")
# a std::type_info as gloo's is (its vtable, its mangled name), with gloo's name
vtable = ctypes.c_void_p.in_dll(cxx, "_ZTVN10__cxxabiv117__class_type_infoE")
name = ctypes.create_string_buffer(b"N4gloo13EnforceNotMetE")
info = (ctypes.c_void_p * 2)(ctypes.addressof(vtable) + 2 * ctypes.sizeof(ctypes.c_void_p), ctypes.addressof(name))
cxx.__cxa_allocate_exception.restype = ctypes.c_void_p
thrown = cxx.__cxa_allocate_exception(ctypes.c_size_t(16))
threading.Thread(target=lambda: cxx.__cxa_throw(ctypes.c_void_p(thrown), info, None)).start()
time.sleep(30)
print("not ended", flush=True)
"""


@pytest.mark.parametrize("me, coordinator_up, line", [
    (1, False, "error: lost process 0 of 2 (the coordinator no longer answers); every process stops"),
    (0, True, "error: a collective between the processes failed (gloo::EnforceNotMet) and no process was seen lost; "
              "every process stops (do they all run the same program? the same config and zoo)"),
])
def test_a_gloo_exception_out_of_a_collective_ends_the_process_in_one_line(me, coordinator_up, line):
    import socket
    port = free_port()
    with socket.socket() as listening:  # a coordinator that answers, or a port nothing listens on
        if coordinator_up:
            listening.bind(("127.0.0.1", port))
            listening.listen()
        done = subprocess.run([sys.executable, "-c", THROW, str(me), f"127.0.0.1:{port}"], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [line], (done.returncode, done.stderr[-2000:])
