"""The Triton GEMM template and its torch reference."""
