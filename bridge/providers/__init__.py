"""The pure parts above every provider protocol (sans-I/O): the prompt cache (``prompts``)."""
