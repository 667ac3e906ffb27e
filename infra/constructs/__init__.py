"""One construct per concern; the stack only wires them together.

Everything that exists in both runtimes (tables, functions, rules, state machines) is built by
looping over `gpufleet.topology`, the description the local emulator builds from as well.
"""
