"""CDK app of gpufleet: one stack, composed from the constructs in `infra.constructs`."""
