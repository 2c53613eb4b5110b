"""Project tooling shared by the scripts, benchmarks and tests: the stage registry, the HF oracle,
comparisons, and random-weight checkpoints of real shapes (``random_checkpoint``)."""
