"""`aot-cache`: the operator's view of what is shipped (bundles, overlay cache, miss log).

Apart from the server's modules in cute_aot.runtime, which never import this package: a server
pays nothing for the operator tooling, and the tooling may read what servers must not import
(aot/binary_info.py runs NVIDIA's cuobjdump and nvdisasm).

    cli        the click commands and their rich tables (entry point `aot-cache`)
    output     shared presentation: console, JSON, sizes, ages, tables
    params     option parsing: sizes, ages, architectures, dtypes
    inventory  bundles, entries, diffs, the miss log and the environment, as data
    check      the checks behind `verify`
    explain    where a problem's kernel would come from, and why
    gc         the overlay cache's contents, and pruning it while servers use it
"""
