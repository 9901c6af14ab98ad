"""The operator's tools, above both the build and the server's runtime:

    aot_cache  `aot-cache`: see, explain, verify and prune what is shipped
    aot_tune   `aot-tune`: time a family's tactics on a GPU and write a dispatch table

They may import the build (aot/) and the runtime; neither imports them, so a server pays
nothing for them (tests/test_layout.py).
"""
