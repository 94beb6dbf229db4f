"""The evaluation engine: packed scoring, the layer loop recorded from the model's own forward,
head hooks, the SSM scan."""
