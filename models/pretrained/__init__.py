"""Pretrained models shipped with iclprobe (package data)."""
