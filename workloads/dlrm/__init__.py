"""DLRM (MLPerf, Criteo Terabyte binary format): embeddings, MLPs, dot interaction."""
