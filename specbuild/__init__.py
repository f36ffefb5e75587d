"""specbuild: speculative decoding from a YAML recipe to a verified Triton deployment."""

__version__ = "0.1.1"
