"""attnlab serve: a web page and an OpenAI-compatible API over trained runs."""
