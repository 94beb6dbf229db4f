"""The evaluation engine: packed scoring, the explicit layer loop, head hooks, the SSM scan."""
