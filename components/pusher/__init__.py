"""Pusher: stock TFX's Pusher component with an executor of ours, whose pushes never share a
version folder and never show a half-written model (push.py)."""
