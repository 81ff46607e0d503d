"""Attention math over per-head groups: token ranks, dense and decode attention, FlexAttention kernels."""
