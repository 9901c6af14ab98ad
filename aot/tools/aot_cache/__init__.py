"""`aot-cache`: the operator's view of what is shipped (bundles, overlay cache, miss log).

A tool (cute_aot.aot.tools), which the server's modules in cute_aot.runtime never import: a
server pays nothing for it, and it may read what servers must not import (aot/binary_info.py
runs NVIDIA's cuobjdump and nvdisasm).

    cli        the click group (entry point `aot-cache`)
    ls, show, verify, explain, diff, misses, gc, env, sass, push, pull
               one module per command: its options, and its table or JSON
    output     the shared renderers: console, JSON, sizes, ages, tables
    params     option parsing: sizes, ages, architectures, dtypes
    facts/     what the commands show, as data, with no click or rich (tested on its own):
               inventory (bundles, entries, diffs, the miss log, the environment), check (the
               checks behind `verify`), explain (where a problem's kernel would come from, and
               why), gc (the caches' contents, and pruning them while servers use them)
"""
