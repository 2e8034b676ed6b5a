"""Megatron-specific code. args/versions are pure; trainer modules import torch lazily."""
