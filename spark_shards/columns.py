"""Spark column types to tf.Example features.

Every atomic type is kept; arrays of atomic types become variable-length features; BinaryType
stays bytes; dates become int64 epoch days and timestamps int64 epoch microseconds; decimals
become float; struct fields are flattened to `parent.child`; nulls become absent features. A
map, or an array of structs or of arrays, has no tf.Example form and is an error naming the
column. The conversions run in Spark SQL before Arrow sees the rows.
"""
from __future__ import annotations

import dataclasses
from typing import Optional


class UnsupportedColumnError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class PlannedColumn:
    name: str  # the feature name: `parent.child` for struct fields
    path: list  # field names from the top-level column down
    # "decimal", or None. Dates and timestamps reach the executors as Arrow dates and
    # timestamps and become epoch seconds in the codec, as from every other source.
    conversion: Optional[str] = None

    @property
    def description(self) -> Optional[str]:
        return {"decimal": "float: a Spark DecimalType column, converted to float32 "
                           "(tf.train.FloatList), so digits beyond float precision are lost"
                }.get(self.conversion)


def plan_columns(schema) -> list[PlannedColumn]:
    """The features of a Spark StructType, in column order."""
    # pyspark.sql.types: 0.14 s to import; only a DataFrame's plan needs it
    from pyspark.sql import types as T

    planned: list[PlannedColumn] = []

    def visit(field_type, path: list) -> None:
        name = ".".join(path)
        element = field_type.elementType if isinstance(field_type, T.ArrayType) else field_type
        if isinstance(field_type, T.StructType):
            for field in field_type.fields:
                visit(field.dataType, path + [field.name])
            return
        if isinstance(field_type, T.MapType):
            raise UnsupportedColumnError(
                f"column {name!r} is a map ({field_type.simpleString()}), which has no "
                "tf.Example form: turn it into struct fields or two array columns first")
        if isinstance(element, (T.StructType, T.ArrayType, T.MapType)):
            raise UnsupportedColumnError(
                f"column {name!r} is an array of {element.typeName()}s "
                f"({field_type.simpleString()}), which has no tf.Example form: explode it or "
                "split it into one array column per field first")
        conversion = "decimal" if isinstance(element, T.DecimalType) else None
        if not isinstance(element, (T.NumericType, T.StringType, T.BinaryType, T.BooleanType,
                                    T.DateType, T.TimestampType, T.TimestampNTZType,
                                    T.NullType)):
            raise UnsupportedColumnError(
                f"column {name!r} has type {field_type.simpleString()}, which has no "
                "tf.Example form")
        planned.append(PlannedColumn(name, path, conversion))

    for field in schema.fields:
        visit(field.dataType, [field.name])
    return planned


def select_features(df, planned: list[PlannedColumn]):
    """`df` with one top-level column per feature, converted as `plan_columns` says. They are
    named `_feature<i>`, since Spark reads a dot in a column name as a struct field; the
    executors give the Arrow columns their feature names (`feature_names`)."""
    # pyspark.sql.functions: 0.26 s to import; only selecting a DataFrame's columns needs it
    from pyspark.sql import functions as F

    def converted(column, conversion):
        return column.cast("double") if conversion == "decimal" else column

    columns = []
    for feature in planned:
        column = F.col(feature.path[0])
        for name in feature.path[1:]:
            column = column.getField(name)
        if feature.conversion and _is_array(df, feature):
            column = F.transform(column, lambda v, c=feature.conversion: converted(v, c))
        else:
            column = converted(column, feature.conversion)
        columns.append(column.alias(f"_feature{len(columns)}"))
    return df.select(*columns)


def _is_array(df, feature: PlannedColumn) -> bool:
    # pyspark.sql.types: 0.14 s to import; only a DataFrame's plan needs it
    from pyspark.sql import types as T

    field_type = df.schema[feature.path[0]].dataType
    for name in feature.path[1:]:
        field_type = field_type[name].dataType
    return isinstance(field_type, T.ArrayType)
