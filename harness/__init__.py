"""Project tooling shared by the scripts and tests: the stage registry, the HF oracle, comparisons."""
