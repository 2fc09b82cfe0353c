"""The base of every component's options dataclass: one JSON form for TFX's execution
properties, Kubeflow's compiled spec and the CLI alike.

A component passes its options to its executor as one string parameter, `OPTIONS_KEY`, so
adding a setting changes the options class and nothing in the component spec.
"""
from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any, Optional, TypeVar

OPTIONS_KEY = "options_json"

T = TypeVar("T", bound="JsonOptions")


class JsonOptions:
    """Mixin for frozen dataclasses: JSON out, and back in with nested options rebuilt."""

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
    """The fields of options class `cls` that `source` (a PipelineConfig) has, by name: a
    setting reaches its component by being named the same in both, with no code between."""
    return {f.name: getattr(source, f.name) for f in dataclasses.fields(cls)
            if hasattr(source, f.name)}


def options_or_settings(cls: type[T], options: Optional[T], settings: dict[str, Any]) -> T:
    """A component's options: the object given, or one built from keyword settings (the
    TFX-style `Component(source=..., num_shards=...)` call), never both."""
    if options is not None and settings:
        raise TypeError(f"give {cls.__name__} or its settings {sorted(settings)}, not both")
    return options if options is not None else cls(**settings)
