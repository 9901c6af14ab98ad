"""The cache dir's layout, declared once: the name of each area below settings.cache_dir().

These names are on disk on every node: changing one orphans what is there (and `aot-cache gc`
collects only the areas named here).
"""

OVERLAY = "overlay"  # runtime/overlay.py: JIT results, <fingerprint>/<arch>/<key id>.cuteaot
LIBS = "libs"  # runtime/library_store.py: verified unpacked libraries and their facts
BUILD = "build"  # aot/build_cache.py: the build cache's default root
REMOTE = "remote"  # runtime/remote.py: verified copies of bundles at URLs, <sha256>.cuteaot
REMOTE_INDEX = "index"  # remote/index/<url id>.json: what each URL held at its last fetch
REMOTE_LOCKS = "locks"  # remote/locks/<url id>.lock: one fetch of a URL at a time
KEYS = "keys"  # the overlay's signing key, keys/overlay.pem
MISS_LOG = "misses.jsonl"  # the default miss log
