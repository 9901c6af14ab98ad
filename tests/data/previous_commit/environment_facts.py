"""Run with 9d40a62's code: the facts of this machine that the artifacts' digests depend on
besides cute-aot's code (what tests/test_previous_commit_artifacts.py needs to find here).

    python3 environment_facts.py > environment.json
"""

import json

from cute_aot.aot import build_cache
from cute_aot.artifacts import toolchain

packer = build_cache.packer_fingerprint()
facts = {
    "toolchain": toolchain.fingerprint(),
    "inspection_tools": build_cache.worker_fingerprint()["tools"],
    "link_inputs": packer["link_inputs"],
    "compiler": packer["compiler"],
    "zstd": list(packer["zstd"]),
}
print(json.dumps(facts, indent=1, sort_keys=True))
