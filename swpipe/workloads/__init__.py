"""Real workloads for swpipe: a DLRM-style model over torch.distributed and its pipeline task functions."""
