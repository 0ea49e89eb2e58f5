"""Settings declared once: default, help, CLI flag and bounds live on the dataclass field.

`setting(...)` makes a dataclass field whose metadata carries its flag; `check_settings(obj)` (called
from each settings object's `__post_init__`) refuses a bad value with a ValueError that names the
flag; `add_flags` / `from_args` generate the argparse flags from the same declarations and build
the object back from them. Pure Python (no torch), so every layer may import it.
"""

from __future__ import annotations

import argparse
import dataclasses
import numbers
import os
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

_KEY = "jumpgate.setting"


@dataclass(frozen=True)
class Flag:
    """How one settings field appears on the command line."""

    flag: str | None  # "--kv-pool-tokens"; None: not a flag (derived from others, see `derived`)
    help: str
    type: type = str  # what the flag's text parses to: str | int | float | bool | list
    choices: tuple[str, ...] | None = None
    min: float | None = None  # inclusive lower bound
    max: float | None = None  # inclusive upper bound
    above: float | None = None  # exclusive lower bound (timeouts)
    optional: bool = False  # None is allowed (the default means "decided later", see default_text)
    negative: bool = False  # a bool that defaults to True, switched off by a --no-... flag
    env: str | None = None  # list fields: comma-separated extra values from this environment variable
    metavar: str | None = None
    default_text: str | None = None  # what the default means when the value alone says little
    group: str | None = None  # help section; None: the object's CLI_GROUP
    derived: str | None = None  # for flag=None: where the value comes from instead

    def describe(self, name: str) -> str:
        """The name a message uses: the flag if there is one, else the field."""
        return self.flag or name


def setting(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    flag: str | None = None,
    default_factory: Any = dataclasses.MISSING,
    **options: Any,
) -> Any:
    """A dataclass field with its CLI declaration; the flag's type comes from the default
    unless `type=` says otherwise."""
    kind = options.pop("type", None)
    if kind is None:
        sample = default_factory() if default_factory is not dataclasses.MISSING else default
        kind = (
            bool
            if isinstance(sample, bool)
            else list
            if isinstance(sample, list)
            else (type(sample) if sample is not None else str)
        )
    meta = {_KEY: Flag(flag=flag, help=help, type=kind, **options)}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def declared(cls_or_obj: Any) -> Iterator[tuple[dataclasses.Field, Flag]]:
    """Every declared setting of a settings class, in declaration order."""
    for f in dataclasses.fields(cls_or_obj):
        spec = f.metadata.get(_KEY)
        if spec is not None:
            yield f, spec


def _check_value(name: str, spec: Flag, value: Any) -> None:
    where = spec.describe(name)
    if value is None:
        if not spec.optional:
            raise ValueError(f"{where}: a value is required")
        return
    if spec.type is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: must be true or false, not {value!r}")
        return
    if spec.type is list:
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ValueError(f"{where}: must be a list of non-empty strings, not {value!r}")
        return
    if spec.type is int and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
        raise ValueError(f"{where}: must be a whole number, not {value!r}")
    if spec.type is float and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise ValueError(f"{where}: must be a number, not {value!r}")
    if spec.type is str and not isinstance(value, str) and (spec.choices or not isinstance(value, os.PathLike)):
        raise ValueError(f"{where}: must be text, not {value!r}")  # a path object is text enough for a folder
    if spec.choices is not None and value not in spec.choices:
        raise ValueError(f"{where}: must be one of {', '.join(spec.choices)}, not {value!r}")
    if spec.min is not None and value < spec.min:
        raise ValueError(f"{where}: must be >= {_num(spec.min)}, not {value!r}")
    if spec.max is not None and value > spec.max:
        raise ValueError(f"{where}: must be <= {_num(spec.max)}, not {value!r}")
    if spec.above is not None and not value > spec.above:
        raise ValueError(f"{where}: must be > {_num(spec.above)}, not {value!r}")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def check_settings(obj: Any) -> None:
    """Type, choices and bounds of every declared field (cross-field rules stay with the object)."""
    for f, spec in declared(obj):
        _check_value(f.name, spec, getattr(obj, f.name))


def flag_of(cls_or_obj: Any, name: str) -> str:
    """The flag of field `name`, for messages about rules that involve several fields."""
    for f, spec in declared(cls_or_obj):
        if f.name == name:
            return spec.describe(name)
    raise KeyError(name)


def help_default(f: dataclasses.Field, spec: Flag) -> str:
    """The '(default: ...)' text the help shows."""
    if spec.default_text is not None:
        return spec.default_text
    default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
    if spec.type is bool:  # say what is on, not whether the flag is given
        return f"{f.name.replace('_', ' ')} {'on' if default else 'off'}"
    if isinstance(default, list):
        return ", ".join(default) or "none"
    return "none" if default is None else str(default)


def add_flags(parser: argparse.ArgumentParser, cls: Any, group_title: str) -> None:
    """Declare the flags of settings class `cls` on `parser` (dest = the field name)."""
    groups: dict[str, Any] = {}
    for f, spec in declared(cls):
        if spec.flag is None:
            continue
        title = spec.group or group_title
        group = groups.get(title) or groups.setdefault(title, parser.add_argument_group(title))
        text = f"{spec.help} (default: {help_default(f, spec)})".lstrip()
        if spec.type is bool:
            # the flag flips the default: --no-x stores False into a field that defaults to True
            group.add_argument(
                spec.flag,
                dest=f.name,
                action="store_false" if spec.negative else "store_true",
                default=argparse.SUPPRESS,
                help=text,
            )
        elif spec.type is list:
            group.add_argument(
                spec.flag, dest=f.name, action="append", default=argparse.SUPPRESS, metavar=spec.metavar, help=text
            )
        else:
            metavar = spec.metavar or (None if spec.choices else "N" if spec.type is int else "X")
            group.add_argument(
                spec.flag,
                dest=f.name,
                type=spec.type,
                choices=spec.choices,
                default=argparse.SUPPRESS,
                metavar=metavar,
                help=text,
            )


def from_args(cls: Any, args: argparse.Namespace, environ: Mapping[str, str] | None = None, **fallbacks: Any) -> Any:
    """Build `cls` from parsed flags, list fields extended by their environment variable. A field
    whose flag was not given (or that has none) takes its value from `fallbacks`, else its default."""
    environ = {} if environ is None else environ
    values: dict[str, Any] = dict(fallbacks)
    for f, spec in declared(cls):
        if spec.flag is None:
            continue
        if hasattr(args, f.name):
            values[f.name] = list(getattr(args, f.name)) if spec.type is list else getattr(args, f.name)
        if spec.env:
            extra = [v.strip() for v in environ.get(spec.env, "").split(",") if v.strip()]
            if extra:
                values[f.name] = list(values.get(f.name, [])) + extra
    return cls(**values)
