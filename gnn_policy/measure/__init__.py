"""Measurement: compile ahead, check against torch, time by CUDA-graph replay."""
