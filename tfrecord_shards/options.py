"""The base of every component's options dataclass: one JSON form for TFX's execution
properties, Kubeflow's compiled spec and the CLI alike, and one declaration per setting.

A component passes its options to its executor as one string parameter, `OPTIONS_KEY`, so
adding a setting changes the options class and nothing in the component spec.

A setting is declared once, as a field made by `setting(default, help, ...)`: its default, its
type (the annotation), its help text and its checks (`choices`, `minimum`, `maximum`). The
options check themselves from those (`check_settings`); the CLI makes its flags from the same
fields (pipeline/cli/options.py), nested options included; `PipelineConfig` holds the nested
options whole. A wrong value is a `SettingError`, which names the setting; each front end
names it its own way (the field for Python and YAML, the flag for the CLI).
"""
from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any, Callable, Iterator, Optional, Sequence, TypeVar

OPTIONS_KEY = "options_json"

T = TypeVar("T", bound="JsonOptions")


class SettingError(ValueError):
    """A wrong setting. The message is `template` with {0}, {1}, ... standing for the
    `settings` it is about, so that each front end can put in its own name for them."""

    def __init__(self, settings: Sequence[str], template: str):
        self.settings, self.template = tuple(settings), template
        super().__init__(template.format(*self.settings))

    def named(self, name: Callable[[str], str]) -> str:
        return self.template.format(*(name(s) for s in self.settings))


def setting(default: Any = dataclasses.MISSING, help: str = "", *,
            choices: Optional[Sequence[Any]] = None, minimum: Optional[float] = None,
            maximum: Optional[float] = None, above: Optional[float] = None, flag: bool = True, metavar: Optional[str] = None,
            default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field that declares a setting: its default, help text and checks
    (`minimum`/`maximum` inclusive, `above` exclusive). `flag=False` keeps it off the command
    line (it is set from Python, YAML or `--set`)."""
    metadata = {"help": help, "choices": tuple(choices) if choices else None,
                "minimum": minimum, "maximum": maximum, "above": above, "flag": flag and bool(help),
                "metavar": metavar}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def check_settings(options: Any) -> None:
    """Each declared setting of a dataclass instance within its choices and bounds (None is
    let through: it means "not set")."""
    for field in dataclasses.fields(options):
        value = getattr(options, field.name)
        meta = field.metadata
        if value is None or not meta:
            continue
        if meta.get("choices") and value not in meta["choices"]:
            raise SettingError([field.name], "{0} must be " + _one_of(meta["choices"]) +
                               f", not {value!r}")
        if meta.get("above") is not None and not value > meta["above"]:
            raise SettingError([field.name], f"{{0}} must be above {meta['above']:g}, "
                                             f"not {value!r}")
        low, high = meta.get("minimum"), meta.get("maximum")
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = f"{low:g} to {high:g}" if low is not None and high is not None else \
                f"at least {low:g}" if low is not None else f"at most {high:g}"
            raise SettingError([field.name], f"{{0}} must be {bounds}, not {value!r}")


def _one_of(choices: Sequence[Any]) -> str:
    names = [str(c) for c in choices]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def nested_options(cls: type) -> dict[str, type]:
    """{field name: options class} for the fields of `cls` that hold options of their own."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)
            if isinstance(hints[f.name], type) and dataclasses.is_dataclass(hints[f.name])}


def flat_fields(cls: type) -> Iterator[tuple[dataclasses.Field, Any]]:
    """(field, its type) for every setting of `cls`, nested options' own settings in place of
    the field that holds them: the flat names YAML, `--set` and keywords use."""
    hints = typing.get_type_hints(cls)
    nested = nested_options(cls)
    for field in dataclasses.fields(cls):
        if field.name in nested:
            yield from flat_fields(nested[field.name])
        else:
            yield field, hints[field.name]


def from_flat(cls: type[T], values: dict[str, Any]) -> T:
    """`cls` built from flat settings: a name that belongs to nested options (`num_shards`)
    goes into them, and a nested field may also be given whole (options or a dict)."""
    values = dict(values)
    for name, nested_cls in nested_options(cls).items():
        mine = {f.name for f, _ in flat_fields(nested_cls)}
        given = {k: values.pop(k) for k in list(values) if k in mine}
        whole = values.get(name)
        if isinstance(whole, dict):
            given = {**whole, **given}
        elif whole is not None:
            given = {**{f.name: getattr(whole, f.name)
                        for f in dataclasses.fields(nested_cls)}, **given}
        if given or whole is not None:
            values[name] = from_flat(nested_cls, given)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    if unknown:
        known = sorted(f.name for f, _ in flat_fields(cls))
        raise KeyError(f"unknown {cls.__name__} settings {unknown}; known: {known}")
    return cls(**values)


class JsonOptions:
    """Mixin for frozen dataclasses: JSON out, and back in with nested options rebuilt; the
    declared settings checked when made."""

    def __post_init__(self) -> None:
        check_settings(self)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls: type[T], text: str) -> T:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls: type[T], values: dict[str, Any]) -> T:
        hints = typing.get_type_hints(cls)
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - fields)
        if unknown:
            raise KeyError(f"unknown {cls.__name__} settings {unknown}; known: {sorted(fields)}")
        built = {}
        for name, value in values.items():
            hint = hints[name]
            if isinstance(value, dict) and isinstance(hint, type) and \
                    issubclass(hint, JsonOptions):
                value = hint.from_dict(value)
            built[name] = value
        return cls(**built)


def settings_for(cls: type, source: Any) -> dict[str, Any]:
    """The settings of options class `cls` that `source` (a PipelineConfig) has, by name,
    for `from_flat`: a setting reaches its component by being named the same in both, with no
    code between. Nested options are taken whole when `source` holds them under the same
    name (`sharding`), else setting by setting."""
    found = {}
    nested = nested_options(cls)
    for field in dataclasses.fields(cls):
        if hasattr(source, field.name):
            found[field.name] = getattr(source, field.name)
        elif field.name in nested:
            found.update(settings_for(nested[field.name], source))
    return found


def options_or_settings(cls: type[T], options: Optional[T], settings: dict[str, Any]) -> T:
    """A component's options: the object given, or one built from keyword settings (the
    TFX-style `Component(source=..., num_shards=...)` call), never both."""
    if options is not None and settings:
        raise TypeError(f"give {cls.__name__} or its settings {sorted(settings)}, not both")
    return options if options is not None else cls(**settings)
