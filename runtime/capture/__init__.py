"""Capture: what a process records and reports about its `cute.compile` calls, above the server.

    activation  the startup hook's work: install the cute.compile hook when the environment asks
    record      CUTE_AOT_RECORD: every call described as a key, appended to a record file
    report      CUTE_AOT_REPORT: what this process compiled, served and missed, written at exit
    virtual     CUTE_AOT_VIRTUAL: a virtual GPU to record on where no GPU is present

It uses the server (runtime/); the server never imports it, so importing the runtime activates
nothing (tests/test_layout.py).
"""
