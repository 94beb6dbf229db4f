"""What only the workflow uses: the config's validation with its checks across keys (and the layer
that may import every other; gna.workflow.layers says which way each may import)."""
