"""`aot-tune` (a tool, like aot_cache: servers never import it): measure a family's tactics on a
GPU from bundles or JIT, and write the winners as a dispatch table."""
