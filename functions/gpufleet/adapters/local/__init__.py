"""In-memory adapters: the same ports as `adapters/aws`, for unit tests and the simulator."""
