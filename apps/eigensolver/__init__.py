"""Distributed generalized symmetric-definite eigensolver on hpccoll (placeholder)."""
