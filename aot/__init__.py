"""The build: key enumeration, parallel cross-compilation, linking, packing, CLI `aot-build`."""
