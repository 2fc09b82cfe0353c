"""Click options made from declared settings (`tfrecord_shards.options.setting`): a field's flag,
type, choices and help come from the field, nested options included, so a setting added to
an options class is on the command line with no change here."""
from __future__ import annotations

import dataclasses
import typing
from typing import Any, Callable

import click

from tfrecord_shards.options import SettingError, flat_fields


def flag_name(setting: str) -> str:
    return "--" + setting.replace("_", "-")


def setting_options(cls: type, skip: tuple[str, ...] = ()) -> Callable:
    """A decorator adding one click option for each declared setting of `cls` (nested
    options' settings included, by their own names). Every option defaults to None, meaning
    "not given": the class's default then applies, and `--help` shows it."""
    def decorate(command):
        for field, hint in reversed(list(flat_fields(cls))):
            meta = field.metadata
            if not meta.get("flag") or field.name in skip:
                continue
            command = _option(field, hint)(command)
        return command
    return decorate


def _option(field: dataclasses.Field, hint: Any):
    meta = field.metadata
    base = _base_type(hint)
    default = field.default if field.default is not dataclasses.MISSING else None
    text = meta["help"] + (f" (default: {default})" if default is not None else "")
    if base is bool:
        name = field.name.replace("_", "-")
        return click.option(f"--{name}/--no-{name}", field.name, default=None, help=text)
    if base is dict:
        return click.option(flag_name(field.name), field.name, multiple=True,
                            metavar=meta.get("metavar") or "KEY=VALUE",
                            help=text + " Repeatable.")
    kind = click.Choice([str(c) for c in meta["choices"]]) if meta.get("choices") else \
        base if base in (int, float) else str
    return click.option(flag_name(field.name), field.name, type=kind, default=None,
                        metavar=meta.get("metavar"), help=text)


def _base_type(hint: Any) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Union and args:
        hint = args[0]
    return typing.get_origin(hint) or hint


def given_settings(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """The settings of `cls` among click's `values` that were given, as their types: the
    flat names `tfrecord_shards.options.from_flat` takes."""
    found = {}
    for field, hint in flat_fields(cls):
        value = values.get(field.name)
        if value is None or value == ():
            continue
        if _base_type(hint) is dict:
            try:
                value = dict(item.split("=", 1) for item in value)
            except ValueError:
                raise click.UsageError(f"{flag_name(field.name)} takes KEY=VALUE") from None
        found[field.name] = value
    return found


def usage_error(error: Exception, flags: Any = None) -> click.UsageError:
    """A wrong setting as the CLI says it: named by its flag when it came from one (every
    setting, unless `flags` names those that did), else by its own name (YAML, `--set`)."""
    if isinstance(error, SettingError):
        return click.UsageError(error.named(
            lambda s: flag_name(s) if flags is None or s in flags else s))
    return click.UsageError(str(error).strip("'\""))
