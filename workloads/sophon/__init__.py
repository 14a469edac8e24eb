"""Near-storage preprocessing offload (SOPHON): the storage node's gRPC service, the pipeline
split into stages, the selective offload policy and the remote dataset of the image workloads."""
