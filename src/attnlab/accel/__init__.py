"""attnlab's tuned code: the C++ training kernels, the fused decoding steps, their builds, and the
streamed and reordered projections of decoding on a CPU."""
