"""Feature names as TensorFlow and Keras take them.

tf.Example takes any string as a feature name (spaces, parentheses, slashes, non-ASCII, the
empty string); op, layer and file names do not. The Examples and schemas keep the source's
names; whatever builds graphs or files from them (the Trainer's layers, Transform's
vocabulary files) uses `op_name`, and looks a feature up by its own name."""
from __future__ import annotations

import re
from typing import Iterable


# The features Transform's default preprocessing derives from a feature `x`: `x__bucket`,
# `x__missing`, an id's `x__id`, and a time's `x__year`, `x__month`, `x__weekday`, `x__hour`.
DERIVED_SUFFIXES = ("__bucket", "__missing", "__id", "__year", "__month", "__weekday",
                    "__hour")


def derived(name: str, source: str) -> bool:
    """Whether feature `name` is `source` or made from it."""
    return name == source or any(name == source + suffix for suffix in DERIVED_SUFFIXES)


def op_name(feature: str) -> str:
    """A name of letters, digits and underscores that starts with a letter."""
    name = re.sub(r"[^A-Za-z0-9_]+", "_", feature).strip("_") or "feature"
    return name if name[0].isalpha() else f"f_{name}"


def op_names(features: Iterable[str]) -> dict[str, str]:
    """`op_name` of each feature, made unique (`name_2`, `name_3`, ...) in order."""
    names: dict[str, str] = {}
    taken: set[str] = set()
    for feature in features:
        base = name = op_name(feature)
        count = 2
        while name in taken:
            name, count = f"{base}_{count}", count + 1
        taken.add(name)
        names[feature] = name
    return names
