"""Fast constructors for frozen, slotted dataclasses on hot paths.

A frozen dataclass's `__init__` sets each field through `object.__setattr__`, about 0.3-0.5 µs
a field here; the events, effects and records built for every line, append and commit pay that
many times over. `slot_constructor` generates a function that sets the slots directly, building
the identical object.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING
from dataclasses import fields as dataclass_fields
from typing import Any, TypeVar

__all__ = ["slot_constructor"]

_T = TypeVar("_T")


def slot_constructor(cls: type[_T], *names: str) -> Callable[..., _T]:
    """A constructor for the frozen, slotted dataclass `cls` taking the fields `names`
    positionally, every other field at its default: `make(*args) == cls(**dict(zip(names,
    args)))`, about 0.4 µs instead of 1-1.5 µs for two or three fields. The code is generated,
    as dataclasses generates `__init__`. If the class has a shape this does not expect (a
    field without a slot, a required field not in `names`), the class itself is used."""
    all_fields = dataclass_fields(cls)  # type: ignore[arg-type]
    known = {f.name for f in all_fields}
    slots = vars(cls)
    if not set(names) <= known or any(f.name not in slots for f in all_fields):
        return lambda *args: cls(**dict(zip(names, args, strict=True)))
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    lines = [f"def make({', '.join(names)}):", "    obj = _new(_cls)"]
    for f in all_fields:
        namespace[f"_set_{f.name}"] = slots[f.name].__set__
        if f.name in names:
            value = f.name
        elif f.default is not MISSING:
            namespace[f"_default_{f.name}"] = f.default
            value = f"_default_{f.name}"
        elif f.default_factory is not MISSING:
            namespace[f"_factory_{f.name}"] = f.default_factory
            value = f"_factory_{f.name}()"
        else:
            return lambda *args: cls(**dict(zip(names, args, strict=True)))
        lines.append(f"    _set_{f.name}(obj, {value})")
    lines.append("    return obj")
    exec("\n".join(lines), namespace)
    make: Callable[..., _T] = namespace["make"]
    return make
