"""What every kernel key is: a frozen value with a canonical JSON form and a stable id.

A key holds everything that changes the binary. Its id is derived from the canonical JSON (sorted
fields, family and family version included), so two keys that would compile differently can never
share an id or an exported symbol.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from typing import Any, ClassVar

_fields_of_class = functools.cache(dataclasses.fields)


class KernelKey:
    """Mixin for frozen dataclasses that are kernel keys. Subclasses set FAMILY."""

    FAMILY: ClassVar[str]
    ABI: ClassVar[str] = "tvm_ffi"

    @property
    def abi(self) -> str:
        """How its exported function is called (artifacts/manifest.py ABIS); a key whose
        calling convention varies per key overrides this."""
        return self.ABI

    def fields(self) -> dict[str, Any]:
        # Key fields are scalars: a shallow read (dataclasses.asdict deep-copies, 10x slower,
        # which shows when a 1000-kernel bundle re-derives every id at load).
        return {
            "family": self.FAMILY,
            **{f.name: getattr(self, f.name) for f in _fields_of_class(type(self))},
        }

    def canonical_json(self) -> str:
        return json.dumps(self.fields(), sort_keys=True, separators=(",", ":"))

    @functools.cached_property
    def id(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:20]

    @functools.cached_property
    def symbol(self) -> str:
        """The exported function name inside a bundle's library: unique per key."""
        return f"{self.FAMILY}_{self.id}"

    @classmethod
    def from_fields(cls, fields: dict[str, Any]):
        fields = dict(fields)
        family = fields.pop("family", cls.FAMILY)
        if family != cls.FAMILY:
            raise ValueError(f"key of family {family!r} given to {cls.FAMILY!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        if set(fields) != names:
            raise ValueError(
                f"{cls.FAMILY} key fields {sorted(fields)} differ from expected {sorted(names)}"
            )
        return cls(**fields)
