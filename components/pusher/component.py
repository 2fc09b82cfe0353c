"""The Pusher component: stock TFX's (same spec, parameters and PushedModel output, read by
stock components) with our executor."""
from __future__ import annotations

from tfx.components.pusher import component as stock
from tfx.dsl.components.base import executor_spec

from components.pusher import executor


class Pusher(stock.Pusher):
    """Stock's Pusher, pushing through `components/pusher/push.py`: each push a version folder
    of its own (microseconds, the next free number on a clash), staged under a name TF Serving
    skips and moved into place with a completion marker written last."""

    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)
