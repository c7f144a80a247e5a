"""Coverage-guided fuzz targets (atheris): ``python -m bench.fuzz.fuzz_NAME`` (``make fuzz``)."""
