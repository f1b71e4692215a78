"""The LLM layer: the Ollama client (one host or several) and making what chat models answer usable."""
