"""The core utilities every room uses, beneath the bundle format itself:

    settings      every CUTE_AOT_* variable, typed and declared once, with one scope()
    cache_layout  the cache areas (folder, unit pattern, commit marker, gc rule)
    atomic        files written whole (temporary name, fsync, rename) and locks
    json_lines    one reader and writer of JSON-lines files, with schemas
    urls          local paths and fsspec URLs
    errors        the one error hierarchy
    notices       warnings said once
    at_exit       work done once at interpreter exit
    terminal      the rich console the tools print through

They import nothing else of cute-aot (tests/test_layout.py).
"""
