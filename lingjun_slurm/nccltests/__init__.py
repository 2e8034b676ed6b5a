"""Parsers for NVIDIA nccl-tests output (text tables and ``-J`` JSON files)."""
