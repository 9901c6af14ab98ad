"""Plain CuTe DSL code as a user writes it, compiled with `cute.compile` (no family): what
recording, replaying and intercepting are tested on."""
